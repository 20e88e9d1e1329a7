"""Scrapes of the engine's ``/metrics``, coalesced, never on the relay path.

One scrape is in flight at a time, at least ``min_gap_s`` (100 ms) apart, and further apart where the engine takes
long to answer (:data:`SCRAPE_DUTY`). Asking for a scrape (a request ended)
returns a future for the first scrape that *starts* after the ask, so requests that end close together share one.
While requests are in flight a periodic scrape (default every 250 ms) keeps the intervals short. Scrape load is
bounded (at most 10 a second) whatever the request rate: it matters, since the engine's API server renders its whole
/metrics text for each. What one scrape reads is bounded too (:data:`MAX_METRICS_BYTES`), and only the families the
recorder uses are parsed. Each scrape's delta settles the chunks that the engine counted in it (see
specproxy/attribution/ledger.py).

A scrape is work for the engine's API server, the process that also takes new requests and streams tokens (vLLM
renders ``/metrics`` on its event loop), so measuring must not land on what is measured:

- **Not while one request is alone.** The periodic scrape parts requests that overlap; a request alone in flight
  is settled by its closing scrape, so none is made meanwhile (at concurrency 1, one scrape per request).
- **Not during a prefill.** A scrape does not start while a request is between its arrival and its first token
  (:meth:`Scraper.prefill_started` / :meth:`Scraper.prefill_ended`), for at most :data:`MAX_DEFER_S`, so that at
  concurrency 1 the end-of-request scrape does not add the render to the next request's TTFT; deferred, it lands between
  two decode steps instead. Intervals are cut by chunk times, so a later scrape shares its delta as exactly as an
  earlier one.
- **Not before the next request of a closed loop.** A closing scrape asked for as the engine goes idle waits up to
  ``arrival_wait_s`` (50 ms) for a request to arrive, and then for its first token as above. A client at
  concurrency 1 sends its next request as soon as it reads the end of the last, so a scrape started at once could go
  out just before that request and meet it at the engine (a race, which the bookkeeping in a process of its own
  mostly loses and a load generator mostly wins). Where nothing arrives, the scrape goes out 50 ms late.
- **Seldom where the engine gives the figures itself.** Once the last :data:`PER_REQUEST_RUN` requests all carried
  the engine's own per-request speculative figures (vLLM's ``metrics.speculative_decoding``), the counters are not
  needed to attribute: the periodic scrape slows to :data:`SLOW_INTERVAL_S` (for status and the engine's totals).
  Closing scrapes stay: they cost one render per burst of ends (coalesced, never during a prefill), and they keep
  the counter estimate beside the engine's figures, the cross-check that shows a counter-only engine's attribution
  is right. One request without the figures brings the usual pace back.
- **Status brought up to date when the engine is quiet**: once no request has been in flight for :data:`QUIET_S`,
  one scrape reads what the last requests left (queue gauges, totals), not sooner, so that it does not meet the next
  request of a closed loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from specproxy.attribution.counts import SpecCounts
from specproxy.attribution.ledger import CounterLedger, counts_of
from specproxy.core.errors import shown_url
from specproxy.core.prom import (
    RECORDER_FAMILIES,
    MetricsParseError,
    Snapshot,
    SpecCounters,
    delta,
    detect_engine,
    gauge,
    parse_snapshot,
    spec_counters,
)

log = logging.getLogger("specproxy.scraper")

# vLLM's /metrics is tens of KB (a few hundred with many models or LoRA adapters). A text over the cap is not read:
# the scrape fails (counted, logged once) and attribution falls back, instead of the recorder parsing megabytes.
MAX_METRICS_BYTES = 8 * 1024 * 1024
INLINE_PARSE_BYTES = 256 * 1024  # larger texts are filtered and parsed in a worker thread
MAX_DEFER_S = 1.0  # the longest a scrape waits for the requests in prefill to get their first token
PER_REQUEST_RUN = 3  # requests in a row with the engine's own figures before the counters are scraped seldom
SLOW_INTERVAL_S = 10.0  # the periodic scrape then
QUIET_S = 0.5  # after the last request ends, the engine quiet this long: one scrape brings status up to date
# While requests overlap, at most this share of the engine's time answers our scrapes: the floor between two scrapes
# is the flight of the recent ones over it (a render that takes 5 ms keeps them 250 ms apart), and it rises by itself
# when a busy engine answers late, which is when a scrape delays its streams most.
SCRAPE_DUTY = 0.02
# ... up to this floor: a flight that long is mostly the engine's queue, not its render, and a record waits for its
# closing scrape (finalize_wait_s) no longer than a few such floors
MAX_GAP_S = 0.5
FLIGHT_WEIGHT = 0.2  # the newest flight's weight in the running mean the floor follows


@dataclass(slots=True)
class ScrapeState:
    ok: int = 0
    errors: int = 0
    failing: int = 0  # scrapes failed in a row, since the last good one
    resets: int = 0
    engine: str = "unknown"
    last_error: str | None = None
    cumulative: SpecCounters | None = None  # sum of settled deltas since the first scrape
    running: float | None = None
    waiting: float | None = None
    accept_length_gauge: float | None = None  # SGLang's sglang:spec_accept_length (a gauge, not a delta)
    accept_rate_gauge: float | None = None


# Requests running and waiting, in each engine's names (SGLang: python/sglang/srt/metrics/collector.py;
# llama.cpp: tools/server/server.cpp)
QUEUE_GAUGES = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    "llamacpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
}


class Scraper:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str | None,
        ledger: CounterLedger,
        *,
        interval_s: float = 0.25,
        timeout_s: float = 2.0,
        min_gap_s: float = 0.1,
        grace_s: float = 0.02,
        arrival_wait_s: float = 0.05,
        max_bytes: int = MAX_METRICS_BYTES,
        on_error: Callable[[], None] | None = None,
        on_settle: Callable[[], None] | None = None,
    ) -> None:
        self._session = session
        self.url = url
        self._shown = shown_url(url) if url is not None else None  # for logs: no credentials
        self._ledger = ledger
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.min_gap_s = min_gap_s
        self.grace_s = grace_s
        self.arrival_wait_s = arrival_wait_s
        self.max_bytes = max_bytes
        self._last_start = 0.0
        self._on_error = on_error
        self._in_flight = ledger.in_flight
        self._on_settle = on_settle
        self._last: Snapshot | None = None
        self._waiters: list[asyncio.Future[bool]] = []
        self._wake = asyncio.Event()  # scrape now (a request ended, or the baseline)
        self._active = asyncio.Event()  # requests are in flight: scrape periodically
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.state = ScrapeState()
        self.flight_s: float | None = None  # running mean of good scrapes' flight, ask to answer
        self._spec = SpecCounts()
        self._gen_tokens = 0.0
        self._read_bytes = 0.0
        self._prefilling = 0
        self._no_prefill = asyncio.Event()  # set while no request waits for its first token
        self._no_prefill.set()
        self._arrived = asyncio.Event()  # a request arrived since the last closing scrape was asked for
        self._own_figures = 0  # requests in a row that carried the engine's own per-request figures
        self.deferred = 0  # scrapes that waited for a prefill to end
        self._stale = False  # a request ended after the last scrape started: status is behind the engine
        # Where the chunks reach the ledger later than they were read (the relays' events cross to a bookkeeping
        # process): awaited with a read time before a delta is settled, it returns once every chunk read until then
        # has arrived, or after a bounded wait. None: chunks are fed as they are read (one process).
        self.catch_up: Callable[[int], Awaitable[bool]] | None = None
        self.caught_up_late = 0  # settles that had to wait for the relays' chunks

    @property
    def enabled(self) -> bool:
        return self.url is not None

    async def start(self) -> None:
        if self.enabled:
            self._task = asyncio.create_task(self._run(), name="specproxy-scraper")
            self._wake.set()  # the baseline scrape
            self._active.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def request(self) -> asyncio.Future[bool]:
        """A future set (True on success) by the first scrape that starts after this call."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if not self.enabled or self._closed:
            fut.set_result(False)
            return fut
        self._waiters.append(fut)
        self._wake.set()
        self._active.set()
        return fut

    @property
    def per_request_figures(self) -> bool:
        """Whether the engine gives each request's speculative figures itself (the last requests all had them)."""
        return self._own_figures >= PER_REQUEST_RUN

    def request_figures(self, own: bool) -> None:
        """A request finished, with (``own``) or without the engine's own speculative figures."""
        self._own_figures = self._own_figures + 1 if own else 0
        self._stale = True
        if self.enabled:
            self._active.set()  # an idle loop starts counting the quiet time from here

    def prefill_started(self) -> None:
        self._prefilling += 1
        self._no_prefill.clear()
        self._arrived.set()

    def prefill_ended(self) -> None:
        """A request got its first token, or ended without one."""
        self._prefilling = max(0, self._prefilling - 1)
        if not self._prefilling:
            self._no_prefill.set()

    def kick(self) -> None:
        """A request started: make sure the periodic loop runs. No scrape now: intervals are cut by the engine's
        step count, so a request needs no scrape of its own at its start, and a scrape costs the engine's API
        server real time (prometheus_client renders vLLM's whole text on every scrape)."""
        if self.enabled:
            self._active.set()

    async def _run(self) -> None:
        while not self._closed:
            quiet = False
            if not self._waiters and self._in_flight() == 0 and not self._wake.is_set():
                self._active.clear()
                if self._stale:  # requests ended since the last scrape: one more once the engine is quiet
                    try:
                        await asyncio.wait_for(self._active.wait(), QUIET_S)
                        continue  # traffic again before the quiet scrape: the usual pace
                    except TimeoutError:
                        quiet = True
                else:
                    await self._active.wait()  # idle until a request starts, asks for a scrape or ends
                    continue
            periodic = False
            if not self._wake.is_set() and not quiet:
                interval = SLOW_INTERVAL_S if self.per_request_figures else self.interval_s
                try:
                    await asyncio.wait_for(self._wake.wait(), interval)
                except TimeoutError:
                    periodic = True
            if periodic and not self._waiters and self._in_flight() <= 1 and self._last is not None:
                continue  # a periodic scrape parts overlapping requests: one alone is settled by its closing scrape
            self._wake.clear()
            if self._closed:
                break
            # back-to-back end-of-request scrapes: keep a floor between them. With one request at a time the closing
            # scrapes are one per request, and each request's counters are exact only if its closing scrape comes
            # before the next request's steps: there the plain floor (one render per request costs the engine little)
            floor = self.gap_s if self._in_flight() > 1 else self.min_gap_s
            gap = self._last_start + floor - time.monotonic()
            if gap > 0:
                await asyncio.sleep(gap)
            if self._waiters and self._last is not None and self._in_flight() == 0 and self.arrival_wait_s > 0:
                await self._await_arrival()  # the engine just went idle: a closed loop's next request is on its way
            if not self._no_prefill.is_set() and self._last is not None:  # the baseline is taken at once
                self.deferred += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._no_prefill.wait(), MAX_DEFER_S)
                if self._closed:
                    break
            self._last_start = time.monotonic()
            self._stale = False
            waiters, self._waiters = self._waiters, []
            ok = False
            try:
                ok = await self._scrape_once()
            except Exception as e:  # a bug of ours (the ledger, a parser): this scrape is lost, scraping goes on
                log.exception("scrape of %s: bookkeeping failed", self._shown)
                self._error(f"{type(e).__name__}: {e}")
            finally:  # also when close() cancels a scrape in flight: its waiters hear "no scrape" at once
                for w in waiters:
                    if not w.done():
                        w.set_result(ok)
        for w in self._waiters:
            if not w.done():
                w.set_result(False)

    @property
    def gap_s(self) -> float:
        """The floor between two scrapes' starts: ``min_gap_s``, or more where a scrape's flight is long
        (:data:`SCRAPE_DUTY`, up to :data:`MAX_GAP_S`)."""
        return max(self.min_gap_s, min(MAX_GAP_S, (self.flight_s or 0.0) / SCRAPE_DUTY))

    async def _await_arrival(self) -> None:
        """Up to ``arrival_wait_s`` for a request to arrive (its prefill then holds the scrape back in turn)."""
        if self._prefilling:
            return
        self._arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), self.arrival_wait_s)

    async def _scrape_once(self) -> bool:
        assert self.url is not None
        issued_ns = time.perf_counter_ns()
        try:
            async with self._session.get(
                self.url,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                # openmetrics would change the format; identity keeps the byte cap a cap (no inflation)
                headers={"Accept": "text/plain", "Accept-Encoding": "identity"},
            ) as resp:
                if resp.status != 200:
                    raise ScrapeError(f"HTTP {resp.status}")
                body = await self._read_capped(resp)
            # the answer is here: the counters were read before this (a parse in a thread, on a busy host, can
            # take longer than the flight, and must not move the boundary)
            returned_ns = time.perf_counter_ns()
            text = body.decode("utf-8", errors="replace")
            if len(body) > INLINE_PARSE_BYTES:  # a large text: filter and parse it off the event loop
                snap = await asyncio.to_thread(parse_snapshot, text, only=RECORDER_FAMILIES)
            else:
                snap = parse_snapshot(text, only=RECORDER_FAMILIES)
        except (aiohttp.ClientError, TimeoutError, MetricsParseError, ScrapeError, ValueError) as e:
            self._error(str(e) or type(e).__name__)
            return False
        flight = (returned_ns - issued_ns) / 1e9
        self.flight_s = flight if self.flight_s is None else self.flight_s + FLIGHT_WEIGHT * (flight - self.flight_s)
        # the engine read its counters somewhere during the scrape's flight: split activity at the middle
        boundary_ns = (issued_ns + returned_ns) // 2
        slack_ns = max(50_000_000, returned_ns - issued_ns)
        self.state.failing = 0
        self.state.last_error = None
        if self._last is None:
            self.state.engine = detect_engine(snap)
            self._ledger.baseline(boundary_ns)
        else:
            d = delta(self._last, snap)
            if d.reset:
                self.state.resets += 1
            if self.state.engine == "unknown":
                self.state.engine = detect_engine(snap)
            counters = spec_counters(self.state.engine, d.values)
            # the chunks of the engine's last counted step may still be on their way to us: give them a moment
            await asyncio.sleep(self.grace_s)
            if self.catch_up is not None and await self.catch_up(boundary_ns + slack_ns):
                self.caught_up_late += 1  # every chunk read by the end of the window had to reach the ledger first
            self._ledger.settle(boundary_ns, counters, reset=d.reset, slack_ns=slack_ns)
            if self._on_settle is not None:
                self._on_settle()
            self._accumulate(counters)
        running, waiting = QUEUE_GAUGES.get(self.state.engine, QUEUE_GAUGES["vllm"])
        self.state.running = gauge(snap, running)
        self.state.waiting = gauge(snap, waiting)
        if self.state.engine == "sglang":  # acceptance as SGLang publishes it: gauges, recomputed every few steps
            self.state.accept_length_gauge = gauge(snap, "sglang:spec_accept_length")
            self.state.accept_rate_gauge = gauge(snap, "sglang:spec_accept_rate")
        self._last = snap
        self.state.ok += 1  # last: a reader that sees the count move sees everything this scrape read
        return True

    async def _read_capped(self, resp: aiohttp.ClientResponse) -> bytes:
        """The body, or a ScrapeError as soon as it passes ``max_bytes`` (the rest is never read)."""
        declared = resp.content_length
        if declared is not None and declared > self.max_bytes:
            raise ScrapeError(f"metrics text of {declared} bytes is over the {self.max_bytes}-byte limit")
        buf = bytearray()
        async for chunk in resp.content.iter_any():
            buf += chunk
            if len(buf) > self.max_bytes:
                raise ScrapeError(f"metrics text over the {self.max_bytes}-byte limit")
        return bytes(buf)

    def _accumulate(self, c: SpecCounters) -> None:
        self._spec = self._spec + counts_of(c)
        self._gen_tokens += c.generation_tokens or 0.0
        self._read_bytes += c.read_bytes or 0.0
        self.state.cumulative = SpecCounters(
            engine=self.state.engine,
            drafts=self._spec.drafts,
            draft_tokens=self._spec.draft_tokens,
            accepted=self._spec.accepted,
            per_position=self._spec.per_position,
            generation_tokens=self._gen_tokens,
            read_bytes=self._read_bytes,
        )

    def learned_k(self) -> float | None:
        """``num_speculative_tokens`` as the counters show it: draft tokens / drafts over everything seen."""
        c = self.state.cumulative
        if c is None or not c.drafts or not c.draft_tokens:
            return None
        return c.draft_tokens / c.drafts

    def _error(self, reason: str) -> None:
        self.state.errors += 1
        self.state.failing += 1
        if self._on_error is not None:
            self._on_error()
        if reason != self.state.last_error:
            log.warning("scrape of %s failed: %s (traffic unaffected; attribution falls back)", self._shown, reason)
        self.state.last_error = reason

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._active.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception:  # it had died of a bug: closing must still let the records be written
                log.exception("the scraper of %s had stopped on an error", self._shown)
        for w in self._waiters:
            if not w.done():
                w.set_result(False)


class ScrapeError(Exception):
    pass
