"""The buffering-hop detector on synthetic timelines: a hop's clumps at its buffer's size, and the direct paths it
must not call buffered (one event per read; several tokens in one speculative event; a busy reader's odd 2-3)."""

from __future__ import annotations

import random
from typing import Any

from specproxy.analysis.figures.buffering import VERDICTS, BufferingInput, BufferingTracker, response_reads
from specproxy.analysis.inputs.scan import ChunkBatch, item_of
from specproxy.analysis.report import render
from specproxy.analysis.report.accum import stream_report
from specproxy.core.record import Record, as_record

EVENT_BYTES = 335  # one OpenAI chat chunk with continuous usage, as the simulator sends it


def _record(i: int, reads: list[list[int]], *, gap_s: float = 0.02, sized: int | None = 0, **extra: Any) -> Record:
    """A streamed record whose token events came in ``reads`` (each read: its events' token counts)."""
    chunks: list[list[float]] = []
    t = 0.05
    for read in reads:
        t += gap_s
        chunks += [[round(t, 6), n] for n in read]
    obj = {
        "request_id": f"r{i}",
        "stream": True,
        "outcome": "ok",
        "status": 200,
        "path": "/v1/chat/completions",
        "chunks": chunks,
        "events": len(chunks) + 1,
        "reads": len(reads) + 1,  # and the read of the usage chunk and [DONE]
        "buffer_sized_reads": sized,
        "completion_tokens": sum(sum(r) for r in reads),
        **extra,
    }
    return as_record(obj)


def _direct(i: int, events: int = 64, tokens: int = 1) -> Record:
    return _record(i, [[tokens]] * events)


def _hop(i: int, events: int, buffer: int = 8192) -> Record:
    """What a hop that releases ``buffer`` bytes at a time (and the rest at the end) hands on."""
    per = buffer // EVENT_BYTES
    full, rest = divmod(events, per)
    reads = [[1] * per for _ in range(full)] + ([[1] * rest] if rest else [])
    return _record(i, reads, gap_s=0.3, sized=full)


def _verdict(records: list[Record]) -> Any:
    tracker = BufferingTracker()
    for r in records:
        tracker.observe(r)
    status = tracker.status()
    assert status["verdict"] in VERDICTS
    return status


def test_a_hop_that_releases_8_kib_at_a_time_is_buffered() -> None:
    v = _verdict([_hop(i, 40 + 10 * i) for i in range(10)])
    assert v["verdict"] == "buffered", v
    ev = v["evidence"]
    assert ev["median_events_per_read"] >= 20
    assert ev["buffer_sized_read_share"] > 0.4
    assert ev["same_read_gap_share"] > 0.9  # the gaps collapsed
    assert "buffered" in v["message"] and "proxy_buffering off" in v["message"] and "\n" not in v["message"]


def test_short_responses_that_arrive_whole_are_buffered_without_a_full_buffer() -> None:
    # under 4 KiB each: the hop never fills, it lets each response go at its end, in one read
    v = _verdict([_hop(i, 8 + i % 4, buffer=4096) for i in range(5)])
    assert v["verdict"] == "buffered", v
    assert v["evidence"]["whole_response_share"] == 1.0
    assert v["evidence"]["buffer_sized_read_share"] == 0.0


def test_records_older_than_the_count_still_tell_by_whole_responses() -> None:
    old = [_record(i, [[1] * 30], sized=None) for i in range(4)]
    v = _verdict(old)
    assert v["verdict"] == "buffered" and v["evidence"]["buffer_sized_read_share"] is None


def test_a_direct_path_is_not_buffered() -> None:
    v = _verdict([_direct(i) for i in range(20)])
    assert v["verdict"] == "unbuffered", v
    assert v["evidence"]["median_events_per_read"] == 1
    assert v["evidence"]["same_read_gap_share"] == 0.0


def test_speculative_steps_bring_several_tokens_in_one_event_and_stay_unbuffered() -> None:
    rng = random.Random(1)
    recs = [_record(i, [[rng.randint(1, 4)] for _ in range(40)]) for i in range(20)]
    assert _verdict(recs)["verdict"] == "unbuffered"


def test_a_busy_reader_coalescing_a_few_events_now_and_then_stays_unbuffered() -> None:
    rng = random.Random(2)
    recs = []
    for i in range(30):
        reads = [[1] * (rng.choice((2, 3)) if rng.random() < 0.3 else 1) for _ in range(50)]
        recs.append(_record(i, reads, sized=rng.random() < 0.05))  # the odd read may be 2**n bytes by chance
    v = _verdict(recs)
    assert v["verdict"] == "unbuffered", v
    assert 0 < v["evidence"]["same_read_gap_share"] < 0.5


def test_many_events_per_read_at_no_buffer_size_are_clumped_not_buffered() -> None:
    # a reader held back (a slow client): many events per read, of any size, each response in many reads
    recs = [_record(i, [[1] * (6 + (j % 5)) for j in range(12)]) for i in range(10)]
    v = _verdict(recs)
    assert v["verdict"] == "clumped", v
    assert "buffer's size" in v["message"]


def test_too_few_responses_is_unknown() -> None:
    v = _verdict([_hop(0, 50), _direct(1, events=5), _direct(2, events=3)])  # short responses say nothing
    assert v["verdict"] == "unknown" and v["evidence"]["responses"] == 1


def test_non_streamed_and_short_records_are_left_out() -> None:
    assert response_reads(as_record({"request_id": "x", "stream": False, "chunks": [[0.1, 5]] * 20})) is None
    assert response_reads(_direct(0, events=7)) is None
    r = response_reads(_record(0, [[1] * 3, [2], [1] * 5]))
    assert r is not None and r.per_read == ((1, 1), (3, 1), (5, 1)) and r.events == 9 and r.data_reads == 3


def test_the_status_judges_only_the_recent_responses() -> None:
    tracker = BufferingTracker(recent=10)
    for i in range(10):
        tracker.observe(_hop(i, 60))
    assert tracker.status()["verdict"] == "buffered"
    for i in range(10):  # the hop was taken out
        tracker.observe(_direct(100 + i))
    assert tracker.status()["verdict"] == "unbuffered"


def test_the_report_warns_per_label_in_text_and_json() -> None:
    recs = [_hop(i, 50, buffer=4096) | {"label": "behind-nginx"} for i in range(5)]
    recs += [_direct(10 + i) | {"label": "direct"} for i in range(5)]
    hops = BufferingInput()
    batch = ChunkBatch()
    for r in recs:
        hops.add(item_of(Record(**r)), batch)  # type: ignore[typeddict-item]
    (w,) = hops.warnings()
    assert w.startswith("behind-nginx: the path looks buffered")
    paths = hops.paths()
    assert paths["behind-nginx"]["buffering"]["verdict"] == "buffered"
    assert paths["direct"]["buffering"]["verdict"] == "unbuffered"
    report, _ = stream_report(item_of(r) for r in recs)
    tables = render.report_tables(report, hops.warnings())
    assert tables[0].notes[0] == f"warning: {w}"
    doc = render.report_json(report, ["x.jsonl"], paths)
    assert doc["paths"]["behind-nginx"]["buffering"]["evidence"]["whole_response_share"] is not None
    assert "paths" not in render.report_json(report, ["x.jsonl"])  # callers without a verdict: as before
