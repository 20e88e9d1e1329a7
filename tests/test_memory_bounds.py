"""What the bookkeeper keeps across requests is bounded by count and by bytes, however fast requests come: each
structure fed far more entries than its cap keeps no more than the cap allows."""

from __future__ import annotations

import asyncio
import tracemalloc

import orjson

from specproxy.attribution.fit import DraftModel
from specproxy.attribution.intervals import Evidence
from specproxy.core.window import Window
from specproxy.core.workload_rules import MAX_WORKLOADS
from specproxy.recorder.config import OtlpConfig
from specproxy.recorder.live_advice import MAX_POINT_BYTES, MAX_POINTS, MAX_RECORD_BYTES, MAX_RECORDS, LiveAdvice
from specproxy.recorder.otlp import MAX_QUEUE_BYTES, SpanExporter
from specproxy.shadow.pairs import MAX_TEXT_CHARS, PairBook
from tests.analysisutil import profile_records


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _traced(build: object) -> int:
    """Bytes that ``build()`` leaves allocated (what it returns is kept until measured)."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        kept = build()  # type: ignore[operator]
        after, _ = tracemalloc.get_traced_memory()
        del kept
        return after - before
    finally:
        tracemalloc.stop()


def test_the_draft_model_keeps_at_most_max_members_however_many_requests_an_interval_holds() -> None:
    """Intervals of 2,000 requests each (a fast engine at high concurrency): the oldest go past MAX_MEMBERS, and
    the model's memory stays within about 200 bytes a member kept."""
    per = 2000

    def build() -> DraftModel:
        model = DraftModel({"chat": Evidence(steps=1000.0, multi=300.0)})
        for _ in range(2 * DraftModel.MAX_MEMBERS // per):
            model.add(10.0, 4.0 * per, [("chat", 2.0, Evidence(steps=8.0, multi=2.0)) for _ in range(per)])
        return model

    model = build()
    assert model.intervals <= DraftModel.MAX_MEMBERS // per
    assert model._kept_members() <= DraftModel.MAX_MEMBERS
    assert _traced(build) < 200 * DraftModel.MAX_MEMBERS
    # one interval larger than the cap is kept alone (the fit needs an interval), the earlier ones let go
    model.add(10.0, 4.0, [("chat", 2.0, Evidence(steps=8.0)) for _ in range(DraftModel.MAX_MEMBERS + 1)])
    assert model.intervals == 1


def test_a_window_keeps_each_cap_by_count_and_bytes_and_a_busy_key_leaves_a_quiet_one_its_entries() -> None:
    clock = Clock()
    w: Window[int] = Window(max_age_s=60.0, max_per_key=50, max_entries=120, max_bytes=10_000, clock=clock)
    w.add("quiet", -1, 10)
    for i in range(100_000):  # a busy key, far past every cap
        w.add("busy", i, 10)
    assert w.entries_kept == 51 and w.bytes_kept == 510  # 50 a key
    assert w.entries() == [-1, *range(100_000 - 50, 100_000)]
    for key in range(1000):  # many keys: the count in all
        w.add(key, key, 10)
    assert w.entries_kept == 120 and w.bytes_kept == 1200
    w2: Window[int] = Window(max_age_s=60.0, max_per_key=10**6, max_entries=10**6, max_bytes=10_000, clock=clock)
    w2.add("quiet", -1, 100)
    for i in range(100_000):  # entries of a large size: the bytes in all, taken from the fullest key
        w2.add("busy", i, 1000)
    assert w2.bytes_kept <= 10_000 and w2.entries()[0] == -1 and len(w2.entries()) == 10
    clock.t = 61.0  # and their age, when read
    assert w2.entries() == [] and w2.entries_kept == 0 and w2.bytes_kept == 0


def test_the_live_advice_keeps_records_and_points_within_count_and_bytes_whatever_their_size_and_workloads() -> None:
    """Records from MAX_WORKLOADS workloads (each under its own 2,000) and with long paths (a client's): the window
    keeps at most MAX_RECORDS records and MAX_RECORD_BYTES of them, the bands MAX_POINTS and MAX_POINT_BYTES."""
    live = LiveAdvice()
    base = profile_records([0.9, 0.85, 0.8], 3, workload="w", requests=1)[0]
    for i in range(MAX_RECORDS * 3):
        live.observe({**base, "workload": f"w{i % MAX_WORKLOADS}", "path": "/v1/chat/completions?" + "x" * 2000})  # type: ignore[typeddict-item]
    records, points = live.snapshot(), live.band_points()
    assert len(records) <= MAX_RECORDS and sum(len(orjson.dumps(r)) for r in records) <= MAX_RECORD_BYTES
    assert len({r["workload"] for r in records}) == MAX_WORKLOADS  # every workload keeps some
    assert len(points) <= MAX_POINTS and sum(len(orjson.dumps(p.rec)) for p in points) <= MAX_POINT_BYTES
    assert len(points) < MAX_POINTS  # the bytes bound first: these points are large


def test_the_span_queue_keeps_at_most_max_queue_bytes_of_spans_with_long_client_strings() -> None:
    """A receiver that is down: spans of records whose model (a client's) is long fill MAX_QUEUE_BYTES before
    max_queue spans, and the oldest go, counted as dropped."""
    exporter = SpanExporter(OtlpConfig(traces_url="http://127.0.0.1:9/v1/traces"))
    base = profile_records([0.9], 1, requests=1)[0]

    async def fill() -> None:
        for i in range(2000):
            exporter.observe({**base, "request_id": f"r{i}", "model": "m" * 20_000})  # type: ignore[typeddict-item]
        task = exporter._task
        assert task is not None
        task.cancel()  # never ran: the loop was not given back

    asyncio.run(fill())
    queued = list(exporter._queue)
    assert sum(len(b) for b in queued) <= MAX_QUEUE_BYTES < 2000 * 20_000
    assert 0 < len(queued) < 2000 and exporter.dropped == 2000 - len(queued)


def test_the_shadow_pair_book_keeps_halves_without_their_chunks_and_texts_within_max_text_chars() -> None:
    """Live requests whose shadows never come back (a candidate that died): each waiting half keeps only what a pair
    reads, not its record's chunks and body, and the greedy texts waiting are capped in all."""
    base = profile_records([0.9], 1, requests=1)[0]
    big = {**base, "request": {"messages": [{"role": "user", "content": "x" * 50_000}]}, "response_text": "y" * 50_000}

    def build() -> PairBook:
        book = PairBook(pending_max=2000)
        for i in range(2000):
            book.expect(f"r{i}", 1, greedy=True)
            book.text(f"r{i}", "t" * 50_000)
            book.live({**big, "request_id": f"r{i}"})
        return book

    book = build()
    assert book.pending == 2000 and sum(len(t) for t in book._texts.values()) <= MAX_TEXT_CHARS
    assert _traced(build) < MAX_TEXT_CHARS * 1.1 + 2000 * 2_000  # the texts kept, and a few hundred bytes a half
