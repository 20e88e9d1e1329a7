"""The simulator's live state: one asyncio driver per engine, request queues, ground truth, metrics, faults.

This is the one simulator module that reads the clock and sleeps. Each engine's driver loops over steps while
it has requests: one sleep per step (until an absolute deadline, so sleep overshoot does not accumulate), then
it fans the step's outputs out to per-request asyncio.Queues. Work per step is O(batch); nothing sleeps per
token or per request, so one process serves hundreds of concurrent streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict

from specproxy.sim.config import SimConfig
from specproxy.sim.engine import EngineCore, SimRequest, new_request
from specproxy.sim.faults import Faults, parse_faults
from specproxy.sim.metrics import SimMetrics
from specproxy.sim.prefix_cache import PrefixCache
from specproxy.sim.records import RequestTruth, StepOutput, Totals
from specproxy.sim.wire import ParsedRequest

GENERATED_TEXTS_KEPT = 4096
# None on a queue means the server is shutting down.
MAX_LAG_S = 0.25
OutputQueue = asyncio.Queue[StepOutput | None]


class SimRuntime:
    """Engines, their drivers and everything a test may want to read back (the ground truth)."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self._t0 = time.monotonic()
        self.cores = [EngineCore(cfg, i) for i in range(cfg.engines)]
        self.metrics = SimMetrics(cfg.served_model_name, cfg.engines, cfg.k)
        self.truth: OrderedDict[str, RequestTruth] = OrderedDict()
        self.metrics_fault = cfg.metrics_fault
        self.request_faults_spec = cfg.request_faults
        self.request_faults: Faults = parse_faults(cfg.request_faults)
        self.closing = asyncio.Event()
        self._queues: dict[str, OutputQueue] = {}
        self.prefix_cache = PrefixCache(cfg.prefix_cache_entries)
        # the texts of recent responses and their token counts: /tokenize counts a generated text as it was generated
        self.generated: OrderedDict[str, int] = OrderedDict()
        self._wake = [asyncio.Event() for _ in self.cores]
        self._tasks: list[asyncio.Task[None]] = []
        self._next_engine = 0

    def now(self) -> float:
        """Monotonic seconds since the server started: the clock of every truth timestamp."""
        return time.monotonic() - self._t0

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._drive(core), name=f"sim-engine-{core.index}") for core in self.cores]

    async def stop(self) -> None:
        self.closing.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for queue in self._queues.values():
            queue.put_nowait(None)

    def create(self, parsed: ParsedRequest, request_id: str, *, stream: bool) -> tuple[SimRequest, OutputQueue]:
        """Make the request known (truth exists from now on) without queueing it yet."""
        engine = self._next_engine
        self._next_engine = (engine + 1) % len(self.cores)
        req = new_request(
            self.cfg,
            request_id=request_id,
            kind=parsed.kind,
            profile_name=parsed.profile,
            prompt_tokens=parsed.prompt_tokens,
            max_tokens=parsed.max_tokens,
            engine=engine,
            started_at_s=self.now(),
            content_key=parsed.content_key,
        )
        req.truth.stream = stream
        req.truth.cached_tokens = self.prefix_cache.lookup_and_insert(parsed.prefix_keys, parsed.prompt_tokens)
        self.truth[request_id] = req.truth
        while len(self.truth) > self.cfg.truth_capacity:
            self.truth.popitem(last=False)
        self.cores[engine].register(req)
        queue: OutputQueue = asyncio.Queue()
        self._queues[request_id] = queue
        return req, queue

    def remember_text(self, text: str, tokens: int) -> None:
        self.generated[text] = tokens
        self.generated.move_to_end(text)
        while len(self.generated) > GENERATED_TEXTS_KEPT:
            self.generated.popitem(last=False)

    def submit(self, req: SimRequest) -> None:
        core = self.cores[req.truth.engine]
        core.submit(req, self.now())
        self.metrics.set_queue_depths(core.index, core.num_running, core.num_waiting)
        self._wake[core.index].set()

    def finish(self, req: SimRequest, reason: str = "abort") -> None:
        """End a request from the API side (client gone, reset, error); no-op if the engine finished it."""
        self._queues.pop(req.id, None)
        core = self.cores[req.truth.engine]
        if core.abort(req.id, self.now(), reason):
            self.metrics.record_finish(core.index, reason)
            self.metrics.set_queue_depths(core.index, core.num_running, core.num_waiting)

    def reset_counters(self) -> None:
        """Start every counter from zero with new `_created` timestamps, as a restarted server would."""
        self.metrics = SimMetrics(self.cfg.served_model_name, self.cfg.engines, self.cfg.k)
        for core in self.cores:
            core.reset_totals()
            self.metrics.set_queue_depths(core.index, core.num_running, core.num_waiting)

    def totals_json(self) -> dict[str, object]:
        """What /metrics should show: per engine and summed over engines."""
        per_engine = []
        total = Totals(k=self.cfg.k)
        for core in self.cores:
            t = core.totals
            per_engine.append(
                {"engine": core.index, "running": core.num_running, "waiting": core.num_waiting, **t.as_json()}
            )
            total.drafts += t.drafts
            total.draft_tokens += t.draft_tokens
            total.accepted += t.accepted
            total.per_position = [a + b for a, b in zip(total.per_position, t.per_position, strict=True)]
            total.prompt_tokens += t.prompt_tokens
            total.generation_tokens += t.generation_tokens
            total.read_bytes += t.read_bytes
            total.steps += t.steps
            for reason, n in t.finished.items():
                total.finished[reason] += n
        return {"spec_method": self.cfg.spec_method, "k": self.cfg.k, "total": total.as_json(), "engines": per_engine}

    async def _drive(self, core: EngineCore) -> None:
        wake = self._wake[core.index]
        speed = self.cfg.speed
        deadline = 0.0
        while True:
            if not core.has_work:
                wake.clear()
                await wake.wait()
                deadline = self.now()  # idle until now: the next step starts now
                continue
            start = self.now()
            # Steps follow each other on an absolute cadence: a step that started late (a sleep's overshoot, a busy
            # event loop) is made up by the next ones, so under load the mean step takes what the model says. Only
            # a lag too large to make up without a burst of short steps starts the cadence afresh.
            if start - deadline > MAX_LAG_S:
                deadline = start
            deadline += core.begin_step(start) / speed
            self.metrics.set_queue_depths(core.index, core.num_running, core.num_waiting)
            await asyncio.sleep(max(0.0, deadline - self.now()))
            report = core.finish_step(self.now())
            metrics = self.metrics
            metrics.record_step(report)
            metrics.set_queue_depths(core.index, core.num_running, core.num_waiting)
            queues = self._queues
            for out in report.outputs:
                queue = queues.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)
                    if out.finish_reason is not None:
                        del queues[out.request_id]
