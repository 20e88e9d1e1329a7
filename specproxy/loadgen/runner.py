"""One process's part of a run: session, recorder, warm-up, the measured repeats, clean stop on a signal.

:func:`drive` owns the resources every sending mode needs (one ``ClientSession`` without a connection cap or a total
timeout, one :class:`~specproxy.recorder.recorder.Recorder`, the signal handlers, the progress reporter) and runs a
sending coroutine inside them; :func:`run_shard` is the load generator's coroutine (warm-up, then ``repeat`` passes of
the plan, closed or open loop), the replay has its own. On SIGINT or SIGTERM the sending stops, in-flight requests are
cancelled (recorded as ``client_cancelled``), and the recorder is closed, which writes every record.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from specproxy.core.schedule import iter_arrivals
from specproxy.loadgen.client import Client, closed_loop, open_loop
from specproxy.loadgen.plan import BodyOptions, Shard, iter_plan
from specproxy.loadgen.progress import Progress, ProgressSnapshot
from specproxy.loadgen.target import Target
from specproxy.recorder.recorder import Recorder, RecorderConfig
from specproxy.serving import stop_signals
from specproxy.workloads import Workload

Reporter = Callable[[ProgressSnapshot], None]


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """Everything one process needs to run its shard of a plan (picklable, for worker processes).

    ``concurrency`` is the total over all shards (each takes its share); with ``rate`` it caps the requests in
    flight, without it the run is closed-loop. ``requests`` is the measured plan's length (None with a duration).
    """

    target: Target
    workloads: tuple[Workload, ...]
    body: BodyOptions
    recorder: RecorderConfig
    seed: int | None = None
    requests: int | None = 100
    duration_s: float | None = None
    concurrency: int | None = 1
    rate: float | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    warmup: int = 0
    repeat: int = 1
    shard: Shard = field(default_factory=Shard)


@dataclass(slots=True)
class DriveResult:
    lags_s: list[float]
    warmup_sent: int = 0
    warmup_failed: int = 0
    conversations_cut: int = 0  # conversations that ended before their last turn (a turn failed or said nothing)
    signal: int | None = None  # the signal that stopped the run, if any
    records_written: int = 0
    records_dropped: int = 0


async def drive(
    *,
    target: Target,
    recorder_cfg: RecorderConfig,
    workloads: list[str],
    send: Callable[[Client], Coroutine[Any, Any, None]],
    reporter: Reporter | None = None,
    report_interval_s: float = 0.5,
    handle_signals: bool = True,
) -> DriveResult:
    """Run ``send(client)`` with a recorder; stop cleanly on SIGINT / SIGTERM."""
    loop = asyncio.get_running_loop()
    result = DriveResult(lags_s=[])
    async with target.session() as session:
        recorder = Recorder(recorder_cfg, session)
        await recorder.start()
        progress = Progress(workloads)
        client = Client(session, target.url, recorder, progress, headers=dict(target.headers))
        main = loop.create_task(send(client), name="specproxy-send")

        def stop(signum: int) -> None:
            if result.signal is None:
                result.signal = int(signum)
                main.cancel()

        ticker = loop.create_task(_report(progress, recorder, reporter, report_interval_s)) if reporter else None
        try:
            with stop_signals(stop) if handle_signals else contextlib.nullcontext():
                await main
        except asyncio.CancelledError:
            if result.signal is None:
                raise  # cancelled from outside, not by our signal handler
        finally:
            await recorder.close()  # every finished (and cancelled) request's record is written here
            if ticker is not None:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
                if reporter is not None:
                    reporter(progress.snapshot(recorder.workload_spec))
        result.lags_s = client.lags_s
        result.warmup_sent, result.warmup_failed = client.warmup_sent, client.warmup_failed
        result.conversations_cut = client.conversations_cut
        result.records_written, result.records_dropped = recorder.sink.written, recorder.sink.dropped
    return result


async def _report(progress: Progress, recorder: Recorder, reporter: Reporter, interval_s: float) -> None:
    while True:
        reporter(progress.snapshot(recorder.workload_spec))
        await asyncio.sleep(interval_s)


async def run_shard(spec: LoadSpec, *, reporter: Reporter | None = None, handle_signals: bool = True) -> DriveResult:
    """Warm-up (unrecorded), then ``spec.repeat`` passes of this shard's part of the plan."""

    async def send(client: Client) -> None:
        share = spec.shard.share(spec.concurrency) if spec.concurrency else None
        if spec.warmup:
            warm = spec.shard.take(islice(iter_plan(spec.workloads, spec.body, spec.seed), spec.warmup))
            await closed_loop(client, warm, max(1, share or 1), repeat=None, warmup=True)
        for repeat in range(spec.repeat):
            plan = iter_plan(spec.workloads, spec.body, spec.seed)  # the same plan every repeat
            entries = islice(plan, spec.requests) if spec.requests is not None else plan
            if spec.rate is None:
                await closed_loop(
                    client, spec.shard.take(entries), share or 1, repeat=repeat, duration_s=spec.duration_s
                )
            else:
                arrivals = iter_arrivals(spec.rate, spec.arrival, spec.burstiness, spec.seed or 0)
                timed = spec.shard.take(
                    zip(arrivals, entries, strict=False)
                )  # the whole plan's offsets, entry by entry
                await open_loop(client, timed, repeat=repeat, cap=share, duration_s=spec.duration_s)

    return await drive(
        target=spec.target,
        recorder_cfg=spec.recorder,
        workloads=[w.name for w in spec.workloads],
        send=send,
        reporter=reporter,
        handle_signals=handle_signals,
    )
