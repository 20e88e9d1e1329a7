"""The load generator behind ``specproxy run`` and ``specproxy replay``.

Layers, each importing only the ones above it: ``plan`` (pure: which requests, bodies, shards) and
``specproxy.core.schedule`` (pure: arrival offsets); ``target`` (checks before a run); ``client`` (one request through
the recorder, closed and open loops); ``runner`` (one process: session, recorder, warm-up, repeats, signals);
``workers`` (several processes); ``replay`` (a recording as a timed plan); ``summary`` (pure: the end-of-run table);
``progress`` (the live line); ``session`` (a whole command: check, run, read back, summarise).
"""

from specproxy.loadgen.plan import BodyOptions, PlannedRequest, Shard, iter_plan, parse_shard, request_body
from specproxy.loadgen.replay import ReplayPlan, plan_replay
from specproxy.loadgen.runner import LoadSpec, run_shard
from specproxy.loadgen.session import RunOutcome, replay, run_load
from specproxy.loadgen.summary import RunSummary, format_summary, summarize_run

__all__ = [
    "BodyOptions",
    "LoadSpec",
    "PlannedRequest",
    "ReplayPlan",
    "RunOutcome",
    "RunSummary",
    "Shard",
    "format_summary",
    "iter_plan",
    "parse_shard",
    "plan_replay",
    "replay",
    "request_body",
    "run_load",
    "run_shard",
    "summarize_run",
]
