"""Shadows, sent from the bookkeeper: a share of live inference requests also goes to candidate servers, each
candidate's replies recorded and compared with the live ones (:mod:`specproxy.shadow`).

The relay is untouched: it serves the client from the primary only and never learns of shadows. The bookkeeper
sees each request's body in its BEGIN event, within the relays' flush delay of its arrival, and sends the shadow
then, with its own HTTP client. A shadow's reply is read to its end by a recorder of its own per candidate (its
engine's ``/metrics`` scraped, its records written to the proxy's record file with the candidate's label and
``shadow_of``), then dropped. The options and the bookkeeper's events reach it through its addon
(:mod:`specproxy.proxy.addons.shadow`). What is bounded:

- at most ``max_inflight`` shadows per candidate: past it a sampled request is not shadowed (``saturated``);
- a candidate that fails :data:`FAILURES_TO_PAUSE` times in a row is left alone for :data:`PAUSE_S` (``failing``);
- a shadow gets ``timeout_s`` without a byte before it is given up (recorded ``timeout``);
- the guard (:class:`~specproxy.shadow.verdicts.Guard`): when live requests that ran beside shadows are measurably
  slower per token than those that did not, shadowing stops for :data:`GUARD_PAUSE_S` (``guard``).

A shadow's body is the live request's (what the bookkeeper parsed: a body over ``--capture-max-bytes`` is not
shadowed, ``body_too_large``), set to stream with continuous usage so its token counts and timings are exact. No
header of the client's is sent on: its credentials never leave the live path. A candidate that needs credentials
gets its own, from a file (``--shadow-credentials-file LABEL=PATH``, read as the upstream's are), never from argv.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specproxy.core.record import Record
from specproxy.core.urls import http_url
from specproxy.recorder.config import RecorderConfig
from specproxy.recorder.exchange import exchange
from specproxy.recorder.recorder import Recorder
from specproxy.recorder.sink import RecordSink
from specproxy.recorder.trace import RequestMeta
from specproxy.shadow.pairs import PairBook
from specproxy.shadow.sample import Sampler, is_greedy
from specproxy.shadow.verdicts import Guard, summarize

log = logging.getLogger("specproxy.shadow")

FAILURES_TO_PAUSE = 5
PAUSE_S = 30.0
GUARD_PAUSE_S = 300.0
SUMMARY_EVERY_S = 5.0
SHADOW_HEADER = "X-Specproxy-Shadow-Of"
_LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_BESIDE_MAX = 100_000  # live requests in flight whose "beside a shadow" is remembered until their record


@dataclass(frozen=True, slots=True)
class ShadowTarget:
    label: str
    url: str  # base URL, no trailing slash
    # the Authorization field the candidate's shadows carry (--shadow-credentials-file LABEL=PATH); never shown
    authorization: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ShadowConfig:
    targets: tuple[ShadowTarget, ...]
    share: float = 0.05
    max_inflight: int = 4
    seed: int = 0
    timeout_s: float = 300.0  # without a byte from the candidate
    connect_timeout_s: float = 10.0
    workloads: frozenset[str] = frozenset()  # only these workloads (empty: all)


def parse_target(spec: str) -> ShadowTarget:
    """``LABEL=URL``, e.g. ``mtp3=http://10.0.0.7:8000``; ValueError with one line otherwise."""
    label, sep, url = spec.partition("=")
    if not sep or not _LABEL_RE.fullmatch(label):
        raise ValueError(f"--shadow wants LABEL=URL (a label of letters, digits, '_', '.', '-'), got {spec!r}")
    base = http_url(url)
    if base is None:
        raise ValueError(f"--shadow {label}: not an http(s) URL: {url!r}")
    parts = urllib.parse.urlsplit(base)
    if parts.username or parts.password:
        raise ValueError(f"--shadow {label}: credentials in the URL would be visible to every local user; not taken")
    return ShadowTarget(label, base)


class Candidate:
    def __init__(self, target: ShadowTarget, recorder: Recorder) -> None:
        self.target = target
        self.recorder = recorder
        self.in_flight = 0
        self.sent = 0
        self.skipped: collections.Counter[str] = collections.Counter()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.failures_in_row = 0
        self.paused_until = 0.0


class Shadower:
    def __init__(self, cfg: ShadowConfig, recorder_cfg: RecorderConfig) -> None:
        self.cfg = cfg
        self.book = PairBook()
        self.guard = Guard()
        self.sampler = Sampler(cfg.share, seed=cfg.seed, workloads=cfg.workloads)
        self._recorder_cfg = recorder_cfg
        self._session: aiohttp.ClientSession | None = None
        self.candidates: dict[str, Candidate] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._beside: collections.OrderedDict[str, bool] = collections.OrderedDict()
        self._live_of: dict[str, str] = {}  # a greedy shadow in flight -> its live request
        self.guard_paused_until = 0.0
        self.guard_trips = 0
        self.guard_reason: str | None = None
        self.offered = 0  # inference requests seen
        self.sampled = 0  # ... drawn for shadowing
        self._summary: tuple[float, int, dict[str, dict[str, dict[str, Any]]]] | None = None

    def summaries(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The pairs' summaries (bootstrap intervals, whose cost grows with the pairs), computed at most every
        :data:`SUMMARY_EVERY_S` for status and metrics alike, and only when pairs came since."""
        now, n = time.monotonic(), self.book.added
        cached = self._summary
        if cached is None or (cached[1] != n and now - cached[0] >= SUMMARY_EVERY_S):
            cached = self._summary = (now, n, summarize(self.book.pairs))
        return cached[2]

    async def start(self, sink: RecordSink) -> None:
        """Open the candidates' recorders; their records go to ``sink`` (the proxy's)."""
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.cfg.connect_timeout_s, sock_read=self.cfg.timeout_s
        )
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=True)
        for t in self.cfg.targets:
            rcfg = replace(
                self._recorder_cfg,
                record_path=None,
                label=t.label,
                metrics_url=t.url + "/metrics",
                probe_url=t.url,
                engine="auto",
                k=None,
                tokenize_url=None,
                tokenizer=None if self._recorder_cfg.tokenizer == "server" else self._recorder_cfg.tokenizer,
                observers=(self._observer(t.label),),
            )
            rec = Recorder(rcfg, self._session, sink=sink)
            rec.on_text = self._text
            await rec.start()
            self.candidates[t.label] = Candidate(t, rec)

    def _observer(self, label: str) -> Callable[[Record], None]:
        def observe(rec: Record) -> None:
            self._live_of.pop(str(rec.get("request_id")), None)  # its text, if any, came before its record
            self.book.shadow(label, rec)

        return observe

    def _text(self, request_id: str, text: str) -> None:
        """A shadow's text (its trace kept it: a greedy pair), before its record."""
        self.book.text(request_id, text, shadow_of=self._live_of.pop(request_id, None))

    # -- the live side -------------------------------------------------------------------------------------------
    def offer(self, meta: RequestMeta) -> bool:
        """A live inference request began (its body parsed, its workload known): shadow it if it is drawn and a
        candidate has room. Whether its text should be kept (a greedy pair, compared for losslessness)."""
        self.offered += 1
        beside = any(c.in_flight for c in self.candidates.values())
        self._beside[meta.request_id] = beside
        while len(self._beside) > _BESIDE_MAX:
            self._beside.popitem(last=False)
        if not self.sampler.take(meta.workload):
            return False
        self.sampled += 1
        now = time.monotonic()
        if now < self.guard_paused_until:
            for c in self.candidates.values():
                c.skipped["guard"] += 1
            return False
        body = meta.body if isinstance(meta.body, dict) and meta.body_bytes is None else None
        sent = 0
        for c in self.candidates.values():
            if body is None:
                c.skipped["body_too_large" if meta.body_bytes is not None else "not_json"] += 1
            elif now < c.paused_until:
                c.skipped["failing"] += 1
            elif c.in_flight >= self.cfg.max_inflight:
                c.skipped["saturated"] += 1
            else:
                self._launch(c, meta, body)
                sent += 1
        if sent:
            self._beside[meta.request_id] = True
        greedy = sent > 0 and is_greedy(body)
        self.book.expect(meta.request_id, sent, greedy=greedy)
        return greedy

    def live_record(self, rec: Record) -> None:
        """Every live record (an observer of the proxy's recorder): pairs, and the guard's two groups."""
        rid = str(rec.get("request_id"))
        beside = self._beside.pop(rid, False) or any(c.in_flight for c in self.candidates.values())
        if rec.get("outcome") == "ok":
            self.guard.observe(str(rec.get("workload") or "default"), rec.get("tpot_s"), beside)
        self.book.live(rec)
        reason = self.guard.tripped()
        if reason is not None:
            self.guard_trips += 1
            self.guard_reason = reason
            self.guard_paused_until = time.monotonic() + GUARD_PAUSE_S
            self.guard.reset()
            log.warning("shadowing paused for %.0f s: %s", GUARD_PAUSE_S, reason)

    def live_text(self, request_id: str, text: str) -> None:
        self.book.text(request_id, text)

    # -- sending ---------------------------------------------------------------------------------------------------
    def _launch(self, c: Candidate, live: RequestMeta, body: dict[str, Any]) -> None:
        c.in_flight += 1
        c.sent += 1
        task = asyncio.get_running_loop().create_task(self._send(c, live, body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, c: Candidate, live: RequestMeta, body: dict[str, Any]) -> None:
        assert self._session is not None
        options = body.get("stream_options")
        shadow_body = {
            **body,
            "stream": True,
            "stream_options": {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
                "continuous_usage_stats": True,
            },
        }
        meta = RequestMeta(
            method=live.method,
            path=live.path,
            workload=live.workload,
            model=live.model,
            body=shadow_body,
            stream_requested=True,
            shadow_of=live.request_id,
            request_id=uuid.uuid4().hex[:16],
        )
        keep_text = self.book.wants_text(live.request_id)
        if keep_text:
            self._live_of[meta.request_id] = live.request_id
        trace = c.recorder.begin(meta, keep_text=keep_text)
        outcome: str = "client_cancelled"
        error: str | None = "proxy stopped"
        try:
            outcome, error = await exchange(
                self._session,
                c.target.url + live.path,
                orjson.dumps(shadow_body),
                self._headers(c, live.request_id),
                trace,
            )
        finally:
            c.in_flight -= 1
            c.outcomes[outcome] += 1
            if outcome == "ok":
                c.failures_in_row = 0
            elif outcome != "client_cancelled":
                c.failures_in_row += 1
                if c.failures_in_row >= FAILURES_TO_PAUSE:
                    c.paused_until = time.monotonic() + PAUSE_S
                    c.failures_in_row = 0
                    log.warning("shadow %s failed %d times in a row (%s): left alone for %.0f s",
                                c.target.label, FAILURES_TO_PAUSE, error, PAUSE_S)  # fmt: skip
            c.recorder.finish(trace, outcome, error)

    @staticmethod
    def _headers(c: Candidate, live_id: str) -> dict[str, str]:
        headers = {"Content-Type": "application/json", SHADOW_HEADER: live_id}
        if c.target.authorization is not None:
            headers["Authorization"] = c.target.authorization
        return headers

    async def close(self) -> None:
        """Stop: shadows in flight are cut (recorded ``client_cancelled``), then each candidate's records written."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        for c in self.candidates.values():
            await c.recorder.close()
        if self._session is not None:
            await self._session.close()

    # -- what the proxy says ---------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        summaries = self.summaries()
        now = time.monotonic()
        return {
            "share": self.cfg.share,
            "offered": self.offered,
            "sampled": self.sampled,
            "pending_pairs": self.book.pending,
            "guard": {
                "paused": now < self.guard_paused_until,
                "trips": self.guard_trips,
                "last_reason": self.guard_reason,
                "tpot_beside_over_alone": self.guard.ratios(),
            },
            "candidates": {
                label: {
                    "url": c.target.url,
                    "sent": c.sent,
                    "in_flight": c.in_flight,
                    "paused": now < c.paused_until,
                    "skipped": dict(sorted(c.skipped.items())),
                    "outcomes": dict(sorted(c.outcomes.items())),
                    "workloads": summaries.get(label, {}),
                }
                for label, c in self.candidates.items()
            },
        }


class ShadowCollector(Collector):
    """``specproxy_shadow_*``: what was sent, skipped and how it ended per candidate; per candidate and workload the
    paired speedup with its interval, the pairs and the greedy pairs' lossless count. Without ``--shadow`` the
    families are there, empty (a dashboard's panels then say "no data", not "no such metric")."""

    def __init__(self, shadower: Shadower | None) -> None:
        self._s = shadower

    def collect(self) -> Iterator[Metric]:
        s = self._s
        sent = CounterMetricFamily("specproxy_shadow_requests", "Shadows sent, by how they ended.",
                                   labels=["candidate", "outcome"])  # fmt: skip
        skipped = CounterMetricFamily("specproxy_shadow_skipped", "Sampled requests not shadowed, by why.",
                                      labels=["candidate", "reason"])  # fmt: skip
        inflight = GaugeMetricFamily("specproxy_shadow_in_flight", "Shadows in flight.", labels=["candidate"])
        speedup = GaugeMetricFamily(
            "specproxy_shadow_speedup",
            "Paired decode speedup of the candidate over the live server (median of pairs; lo/hi: 95% interval).",
            labels=["candidate", "workload", "bound"],
        )
        pairs = GaugeMetricFamily("specproxy_shadow_pairs", "Pairs in the window.", labels=["candidate", "workload"])
        greedy = GaugeMetricFamily("specproxy_shadow_greedy_pairs", "Greedy pairs in the window, by text verdict.",
                                   labels=["candidate", "workload", "text"])  # fmt: skip
        acceptance = GaugeMetricFamily("specproxy_shadow_acceptance", "The candidate's pooled acceptance rate.",
                                       labels=["candidate", "workload"])  # fmt: skip
        paused = GaugeMetricFamily("specproxy_shadow_guard_paused", "1 while the guard holds shadowing off.")
        if s is None:
            yield from (sent, skipped, inflight, speedup, pairs, greedy, acceptance, paused)
            return
        for label, c in s.candidates.items():
            inflight.add_metric([label], c.in_flight)
            for outcome, n in c.outcomes.items():
                sent.add_metric([label, outcome], n)
            for reason, n in c.skipped.items():
                skipped.add_metric([label, reason], n)
        for label, per in s.summaries().items():
            for w, summ in per.items():
                pairs.add_metric([label, w], summ["pairs"])
                if summ["speedup"]["median"] is not None:
                    speedup.add_metric([label, w, "point"], summ["speedup"]["median"])
                    if summ["speedup"]["ci"] is not None:
                        speedup.add_metric([label, w, "lo"], summ["speedup"]["ci"][0])
                        speedup.add_metric([label, w, "hi"], summ["speedup"]["ci"][1])
                ll = summ["lossless"]
                for text in ("identical", "tail", "diverged"):
                    greedy.add_metric([label, w, text], ll[text])
                if summ["acceptance"]["value"] is not None:
                    acceptance.add_metric([label, w], summ["acceptance"]["value"])
        paused.add_metric([], 1.0 if time.monotonic() < s.guard_paused_until else 0.0)
        yield from (sent, skipped, inflight, speedup, pairs, greedy, acceptance, paused)
