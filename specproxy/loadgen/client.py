"""Sending: one request through the recorder, and the two ways of pacing many (closed loop, open loop).

Each measured request is recorded by the same :class:`~specproxy.recorder.recorder.Recorder` the proxy uses: begin,
response headers, every ``iter_any()`` read with its ``perf_counter_ns`` time, finish with an outcome. Warm-up
requests are sent the same way but not recorded. The hot path per read is the recorder's ``feed``, nothing else:
no logging, no progress work.

Open-loop sends are paced on absolute targets (``start + offset`` on the loop's monotonic clock); the lag between a
target and the moment the request really goes out is kept per request so a run can report whether it kept up.
Cancellation (Ctrl-C, SIGTERM) reaches every in-flight request; each is recorded as ``client_cancelled``.

A conversation (an entry with follow-ups) is one user: its turns go out one after another, each after the last one's
reply and the workload's think time, each carrying the model's own earlier replies, each recorded with the
conversation's id and its turn. A turn that fails or brings no text ends the conversation there (the user would not
go on either); :attr:`Client.conversations_cut` counts those.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Mapping

import aiohttp
import orjson

from specproxy.core.figures import ttft_s
from specproxy.core.headers import WORKLOAD_HEADER
from specproxy.loadgen.plan import PlannedRequest, next_turn
from specproxy.loadgen.progress import Progress
from specproxy.recorder.exchange import exchange
from specproxy.recorder.recorder import Recorder
from specproxy.recorder.trace import RequestMeta, Trace


class Client:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        target: str,
        recorder: Recorder,
        progress: Progress,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._session = session
        self._target = target
        self._recorder = recorder
        self._progress = progress
        self._headers = dict(headers or {})
        self.lags_s: list[float] = []
        self.warmup_sent = 0
        self.warmup_failed = 0
        self.conversations_cut = 0
        # one request at a time: wait for each request's closing scrape before the next (Recorder.settle)
        self.settle = False

    def _request_headers(self, workload: str) -> dict[str, str]:
        # The workload header lets a specproxy proxy in between file the request under the same workload.
        return {**self._headers, "Content-Type": "application/json", WORKLOAD_HEADER: workload}

    async def send(
        self,
        entry: PlannedRequest,
        *,
        repeat: int | None,
        target_time: float | None = None,
        release: asyncio.Semaphore | None = None,
    ) -> None:
        """Send one measured request (every turn of a conversation) and record it. Never raises but CancelledError."""
        try:
            if target_time is not None:
                self.lags_s.append(max(0.0, asyncio.get_running_loop().time() - target_time))
            if not entry.followups:
                await self._send_turn(entry, entry.body, repeat=repeat)
                return
            conversation = uuid.uuid4().hex[:16]
            body = entry.body
            for turn in range(1, entry.turns + 1):
                reply = await self._send_turn(entry, body, repeat=repeat, conversation=conversation, turn=turn)
                if turn == entry.turns:
                    return
                if reply is None:
                    self.conversations_cut += 1
                    return
                if entry.think_time_s > 0:
                    await asyncio.sleep(entry.think_time_s)
                body = next_turn(body, reply, entry.followups[turn - 1])
        finally:
            if release is not None:
                release.release()

    async def _send_turn(
        self,
        entry: PlannedRequest,
        body: dict[str, object],
        *,
        repeat: int | None,
        conversation: str | None = None,
        turn: int | None = None,
    ) -> str | None:
        """One request, recorded; the reply's text when it came back complete and non-empty (a conversation's next
        turn is built on it), else None."""
        model = body.get("model")
        meta = RequestMeta(
            method="POST",
            path=entry.path,
            workload=entry.workload,
            model=model if isinstance(model, str) else None,
            body=body,
            stream_requested=bool(body.get("stream")),
            replay_of=entry.replay_of,
            repeat=repeat,
            conversation=conversation,
            turn=turn,
        )
        trace = self._recorder.begin(meta, keep_text=conversation is not None)
        self._progress.started(entry.workload)
        outcome: str = "client_cancelled"  # unless the exchange returns
        error: str | None = "run stopped"
        try:
            outcome, error = await self._exchange(entry.path, body, entry.workload, trace)
        finally:
            self._recorder.finish(trace, outcome, error)
            tl = trace.timeline
            tokens = sum(n for _, n in tl.chunks if n > 0) if tl is not None else 0
            ttft = ttft_s(tl.start_ns, tl.first_token_ns) if tl is not None else None
            self._progress.finished(entry.workload, outcome == "ok", tokens, ttft)
        if self.settle:
            await self._recorder.settle(trace)
        if outcome != "ok" or conversation is None or trace.timeline is None:
            return None
        return trace.timeline.reply_text()

    async def _exchange(
        self, path: str, body: Mapping[str, object], workload: str, trace: Trace
    ) -> tuple[str, str | None]:
        return await exchange(
            self._session, self._target + path, orjson.dumps(body), self._request_headers(workload), trace
        )

    async def boundary(self) -> None:
        """Between what was sent and what comes next, a scrape (Recorder.boundary)."""
        await self._recorder.boundary()

    async def warm(self, entry: PlannedRequest) -> None:
        """Send one request, read it to the end, record nothing."""
        self.warmup_sent += 1
        try:
            url = self._target + entry.path
            async with self._session.post(
                url, data=orjson.dumps(entry.body), headers=self._request_headers(entry.workload)
            ) as resp:
                async for _ in resp.content.iter_any():
                    pass
                if resp.status >= 400:
                    self.warmup_failed += 1
        except (aiohttp.ClientError, TimeoutError, OSError):
            self.warmup_failed += 1


async def closed_loop(
    client: Client,
    entries: Iterator[PlannedRequest],
    concurrency: int,
    *,
    repeat: int | None,
    duration_s: float | None = None,
    warmup: bool = False,
) -> None:
    """``concurrency`` slots, each sending its next entry as soon as its last one finished, until the entries run
    out or ``duration_s`` has passed (requests in flight then finish)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration_s if duration_s is not None else None

    async def slot() -> None:
        while deadline is None or loop.time() < deadline:
            entry = next(entries, None)  # no await in between: slots never take the same entry
            if entry is None:
                return
            if warmup:
                await client.warm(entry)
            else:
                await client.send(entry, repeat=repeat)

    async with asyncio.TaskGroup() as tg:
        for _ in range(concurrency):
            tg.create_task(slot())


async def open_loop(
    client: Client,
    timed: Iterator[tuple[float, PlannedRequest]],
    *,
    repeat: int | None,
    cap: int | None = None,
    duration_s: float | None = None,
) -> None:
    """Send each entry at ``start + offset`` (absolute targets, so lateness never accumulates), with at most
    ``cap`` in flight when given: a capped send waits, and its wait shows as send lag."""
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(cap) if cap else None
    start = loop.time()
    async with asyncio.TaskGroup() as tg:
        for offset, entry in timed:
            if duration_s is not None and offset >= duration_s:
                break
            target = start + offset
            delay = target - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is not None:
                await sem.acquire()  # acquired here, in order: a cap never reorders the sends
            tg.create_task(client.send(entry, repeat=repeat, target_time=target, release=sem))
