"""Names vulture cannot see used, because something other than our code uses them. Dead code is removed, not listed.

Run as `.venv/bin/vulture specproxy benchmarks tests .ci/vulture_whitelist.py --min-confidence 60`, as
.ci/run does."""

# ruff: noqa: B018, F821

# typer calls the commands and the root callback it registers with @app.command / @app.callback.
_root  # cli.py
report_cmd  # commands/analysis.py
compare_cmd
advise_cmd
export_cmd  # commands/export.py
replay_cmd  # commands/run.py
sweep_cmd  # commands/sweep.py
whatif_cmd  # commands/whatif.py
_.context_settings  # commands/engine.py: read by click when it parses the serve command's arguments
_.format_options  # commands/proxy.py: click calls it to write --help
_.__signature__  # commands/proxy.py: typer reads the proxy command's options from it

# Attributes set on third-party objects, which read them: RE2's options, a logging record, aiohttp's writer.
_.log_errors  # core/workload_rules.py
_.stack_info  # server_log.py
_.levelname
_.output_size  # proxy/server.py
_.pre_tokenizer  # tests/test_tokenizer.py: a tokenizers.Tokenizer

# Fields of records written whole (asdict, orjson, TypedDict rows), read by whoever reads the file or the JSON.
SPEC_SOURCES  # core/record.py: the documented set of spec sources
estimates
server_source  # core/record.py: SpecBlock, read by whoever reads the record
schema_version
upstream_headers_s
proxy_overhead_s
read_bytes_per_token
retry_ms  # core/sse.py: SSEEvent carries the event's retry field
finished_at  # matrix/results.py
accept_rate_gauge  # recorder/scraper.py
_.accept_rate_gauge
min_tokens  # bench/soak.py: read back through asdict(cfg) in the soak's child process
cancel_share
reset_share
requests_between  # bench/growth.py: in the soak's JSON and table, through asdict

# A task held so that it is not collected while it runs (asyncio keeps only a weak reference).
_.connecting  # bench/floors.py

# Library API that docs/sweep.md points readers at for the simulator's own truth.
crossover_batch  # sim/costs.py

# pytest calls fixtures, hooks and reads pytestmark by name.
data_dir  # tests/conftest.py
pytest_collection_modifyitems
vllm_cpu_layout
promtool  # tests/test_deploy_monitoring.py
pytestmark
_unit_guard  # tests/conftest.py: autouse, guards the unit tier

# Read by name through getattr (proxy/bookkeeper.py Connection.final: a relay's accounting at the bookkeeper's end).
_.begun
_.late_written
_.late_dropped

# httptools (llhttp) calls its protocol object back by these names: proxy/llbody.py
_.on_body
_.on_message_begin
_.on_message_complete

# Read by name through getattr (shadow/verdicts.py _pooled: the live side's pooled acceptance of shadow pairs).
_.live_draft_tokens
