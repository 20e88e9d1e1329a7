"""Measuring the configurations of a matrix one after another: start (or reach) the server, wait until it is
healthy, warm up, send the plan's requests workload by workload for every repeat through the load generator's
recorder, stop the server by its process group, and note the outcome in the results folder.

One configuration's failure (it never became healthy, it exited, no request succeeded) is noted with its error and
its log's last lines, and the next configuration is measured. The requests come from one :class:`MatrixPlan`, so
every configuration gets the same bodies in the same order; only the model name is the configuration's own.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from specproxy.core.errors import one_line
from specproxy.core.record import read_records
from specproxy.loadgen.client import Client, closed_loop
from specproxy.loadgen.progress import ProgressSnapshot
from specproxy.loadgen.runner import drive
from specproxy.loadgen.target import Target, TargetError, find_model
from specproxy.matrix.plan import MatrixPlan, with_model
from specproxy.matrix.progress import Tracker
from specproxy.matrix.results import Entry, Results, config_fingerprint
from specproxy.matrix.server import ServerError, ServerProcess, free_port
from specproxy.matrix.spec import Configuration, MatrixSpec, expand, expand_all
from specproxy.recorder.recorder import RecorderConfig

HOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Prepared:
    """A configuration with its placeholders filled: what is started and where it answers."""

    config: Configuration
    args: tuple[str, ...] | None
    env: Mapping[str, str]
    url: str
    port: int | None
    health: str  # a path under url, or a URL


@dataclass(slots=True)
class ConfigResult:
    label: str
    status: str  # "measured", "skipped" (measured by an earlier run), "failed"
    error: str | None = None
    tail: tuple[str, ...] = ()
    survivors: list[int] = field(default_factory=list)
    pid: int | None = None  # the server's process (and process group) id, when it was started


def prepare(config: Configuration, results: Path, environ: Mapping[str, str], port: int | None) -> Prepared:
    """Fill the placeholders. Raises MatrixError (an unset ``${NAME}``). ``port`` None: checking only."""
    where = f"configurations ({config.label})"
    values = {
        "port": str(port if port is not None else 0),
        "host": HOST,
        "label": config.label,
        "results": str(results),
        "cache": str(results / "cache"),
        "python": sys.executable,
    }
    args = tuple(expand_all(config.command, values, environ, f"{where}.command")) if config.command else None
    env = {k: expand(v, values, environ, f"{where}.env.{k}") for k, v in config.env.items()}
    if config.url is not None:
        url = expand(config.url, values, environ, f"{where}.url").rstrip("/")
    else:
        url = f"http://{HOST}:{values['port']}"
    health = expand(config.health, values, environ, f"{where}.health")
    return Prepared(config, args, env, url, port, health)


class MatrixRunner:
    def __init__(
        self,
        spec: MatrixSpec,
        plan: MatrixPlan,
        results: Results,
        *,
        environ: Mapping[str, str] | None = None,
        on_progress: Callable[[Tracker], None] | None = None,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.results = results
        self.environ = dict(os.environ if environ is None else environ)
        self.on_progress = on_progress
        self.plan_fp = plan.fingerprint()

    def fingerprint(self, config: Configuration) -> str:
        return config_fingerprint(config, self.plan_fp)

    def to_measure(self, force: bool) -> list[Configuration]:
        return [c for c in self.spec.configurations if force or not self.results.measured(c.label, self.fingerprint(c))]

    async def run(self, todo: list[Configuration], tracker: Tracker) -> list[ConfigResult]:
        out: list[ConfigResult] = []
        todo_labels = {c.label for c in todo}
        for config in self.spec.configurations:
            if config.label not in todo_labels:
                out.append(ConfigResult(config.label, "skipped"))
                continue
            tracker.next_config(config.label)
            out.append(await self._one(config, tracker))
        return out

    def _tick(self, tracker: Tracker) -> None:
        if self.on_progress is not None:
            self.on_progress(tracker)

    async def _one(self, config: Configuration, tracker: Tracker) -> ConfigResult:
        t0 = time.monotonic()
        part = self.results.begin(config.label)
        log = self.results.log_path(config.label)
        prepared = prepare(config, self.results.folder, self.environ, free_port(HOST) if config.command else None)
        server = ServerProcess(config.label, prepared.args or (), prepared.env, log)
        result = ConfigResult(config.label, "failed")
        records = 0
        try:
            if prepared.args is not None:
                with log.open("ab") as f:
                    f.write(f"--- specproxy matrix: starting {config.label} on {prepared.url}\n".encode())
                await server.start()
                result.pid = server.pid
            tracker.phase("starting")
            self._tick(tracker)
            await server.wait_healthy(
                prepared.url, prepared.health, config.start_timeout_s, fallback_models=not config.health_given
            )
            tracker.started()
            records = await self._measure(prepared, server, part, tracker)
            result.status = "measured"
        except ServerError as e:
            result.error, result.tail = str(e), e.tail
        except TargetError as e:
            result.error, result.tail = str(e), tuple(server.tail())
        except asyncio.CancelledError:
            result.error = "interrupted"
            raise
        except Exception as e:  # anything else ends this configuration, not the matrix: the others are measured
            result.error, result.tail = f"{type(e).__name__}: {one_line(e, 300)}", tuple(server.tail())
        finally:
            if server.process is not None:
                tracker.phase("stopping")
                self._tick(tracker)
                result.survivors = await server.stop(self.spec.stop_timeout_s)
                if result.survivors and result.error is None:
                    result.status = "failed"
                    result.error = f"processes {result.survivors} survived SIGKILL of the process group"
            entry = Entry(
                status=result.status,
                fingerprint=self.fingerprint(config),
                error=result.error,
                log_tail=result.tail,
                records=records,
                seconds=round(time.monotonic() - t0, 3),
                finished_at=time.time(),
            )
            self.results.finish(config.label, entry)
        return result

    async def _measure(self, prepared: Prepared, server: ServerProcess, part: Path, tracker: Tracker) -> int:
        config, url = prepared.config, prepared.url
        target = Target(url)
        async with target.session() as session:
            model = await find_model(session, url, config.model)
        metrics = None
        if config.metrics is not None:
            metrics = config.metrics if "://" in config.metrics else url + config.metrics
        rcfg = RecorderConfig(
            record_path=str(part),
            metrics_url=metrics,
            label=config.label,
            capture="request",
            k=config.k,
            run_id=uuid.uuid4().hex[:12],
        )
        plan = self.plan

        def check_alive() -> None:
            if server.exited is not None:
                raise ServerError(f"exited with code {server.exited} during the measurement", server.tail())

        async def send(client: Client) -> None:
            if plan.warmup:
                tracker.phase("warm-up")
                self._tick(tracker)
                await closed_loop(
                    client, iter(with_model(plan.warmup, model)), plan.concurrency, repeat=None, warmup=True
                )
                tracker.add_done(len(plan.warmup))
            # one at a time, each request's counters are exact only if no scrape interval holds another's steps
            client.settle = plan.concurrency == 1
            if client.settle and plan.warmup:
                await client.boundary()
            for repeat in range(plan.repeats):
                for name, reqs in plan.per_workload:
                    check_alive()
                    tracker.phase(f"{name} repeat {repeat + 1}/{plan.repeats}")
                    self._tick(tracker)
                    await closed_loop(client, iter(with_model(reqs, model)), plan.concurrency, repeat=repeat)
            check_alive()

        def report(snap: ProgressSnapshot) -> None:
            tracker.measured_done(int(sum(c["done"] for c in snap.values())))
            self._tick(tracker)

        await drive(  # a ServerError from send() comes out of here once the recorder has written every record
            target=target,
            recorder_cfg=rcfg,
            workloads=[name for name, _ in plan.per_workload],
            send=send,
            reporter=report,
            report_interval_s=1.0,
            handle_signals=False,
        )
        recs = await asyncio.to_thread(lambda: list(read_records(part)) if part.exists() else [])
        ok = [r for r in recs if r["outcome"] == "ok"]
        if not ok:
            first = next((r["error"] for r in recs if r["error"]), "no record written")
            raise ServerError(f"no request succeeded ({len(recs)} sent; first error: {first})", server.tail())
        return len(recs)
