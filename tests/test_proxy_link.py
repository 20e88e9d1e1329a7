"""The relay's end of the bookkeeping channel (specproxy.proxy.link), driven on the test's loop: events out as
frames, shedding past the soft limit, records lost past the hard limit or with no bookkeeper (counted by cause),
acknowledgements and answers in. The bookkeeper here is a fake that decodes what it is handed; the socket side is
driven through its protocol methods with a fake transport (the socket itself is reached end to end only)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from specproxy.core.request_body import SCAN_BYTES, Body
from specproxy.proxy.events import (
    ACK,
    BEGIN,
    CHUNK,
    FINISH,
    HEAD,
    HEALTH,
    QUERY,
    REFUSED,
    REPLY,
    STATS,
    FrameReader,
    frame,
    reply_payload,
    split_begin,
)
from specproxy.proxy.link import GONE, EventLink, _SocketSide, header_names

CHAT = "/v1/chat/completions"


class FakeBookkeeper:
    """Takes the link's batches as the bookkeeper's reader would; answers queries when told what to answer."""

    def __init__(
        self,
        link: EventLink,
        answer: tuple[int, str, bytes] | None = None,
        fail: bool = False,
        die_on_query: bool = False,
    ) -> None:
        self.link = link
        self.answer = answer
        self.fail = fail
        self.die_on_query = die_on_query
        self.frames: list[tuple[int, int, int, bytes]] = []
        self.writes = 0
        self._reader = FrameReader()

    def send(self, data: bytes) -> None:
        if self.fail:
            raise OSError("pipe broke")
        self.writes += 1
        for f in self._reader.feed(data):
            self.frames.append(f)
            if f[0] == QUERY and self.die_on_query:
                self.link.gone("died while asked")
            elif f[0] == QUERY and self.answer is not None:
                status, ctype, body = self.answer
                self.link.received(frame(REPLY, f[1], status, reply_payload(ctype, body)))

    def kinds(self) -> list[int]:
        return [f[0] for f in self.frames if f[0] != STATS]

    def of(self, kind: int) -> list[tuple[int, int, int, bytes]]:
        return [f for f in self.frames if f[0] == kind]


def _link(soft: int = 1 << 20, hard: int = 1 << 21, capture: int = 1 << 20, names: tuple[str, ...] = ()) -> EventLink:
    return EventLink(soft_bytes=soft, hard_bytes=hard, capture_max_bytes=capture, header_names=names)


def _attached(**kw: Any) -> tuple[EventLink, FakeBookkeeper]:
    link = _link(**kw)
    bk = FakeBookkeeper(link)
    link.attach_local(bk.send)
    link.flush()  # the attach's STATS frame: the buffer starts empty
    return link, bk


def _body(n: int) -> Body:
    return Body([b"x" * n]) if n else Body()


def test_header_names_are_lowercased_deduplicated_sorted_and_traceparent_only_with_trace() -> None:
    assert header_names(["X-Team", "x-team", "Authorization"], trace=False) == ("authorization", "x-team")
    assert header_names([], trace=True) == ("traceparent",)
    assert header_names(["TraceParent"], trace=False) == ("traceparent",)


def test_the_hard_limit_is_never_below_the_soft_one() -> None:
    assert _link(soft=100, hard=10).hard_bytes == 100


def test_without_a_bookkeeper_an_inference_request_is_a_lost_record_and_other_requests_are_not() -> None:
    link = _link()
    r = link.begin("POST", CHAT, {}, None, _body(10))
    assert (r.lost, r.cause) == (True, "no_bookkeeper")
    link.head(r, 200, "text/event-stream", None)
    link.chunk(r, 1, b"data: {}\n\n")
    link.finish(r, "ok", None)
    g = link.begin("GET", "/v1/models", {}, None, _body(0))
    link.finish(g, "ok", None)
    assert (link.lost, link.lost_by, link.finished, link.requests, link.in_flight) == (1, {"no_bookkeeper": 1}, 1, 2, 0)
    assert link.final() == {
        "lost": 1, "lost_by": {"no_bookkeeper": 1}, "finished": 1, "written": 0, "pending": 0, "doubtful": [],
    }  # fmt: skip


async def test_a_request_goes_out_as_begin_head_chunks_finish_in_one_write() -> None:
    link, bk = _attached(names=("x-team",))
    writes = bk.writes
    r = link.begin("POST", CHAT, {"x-team": "a", "other": "b"}, "wl", Body([b'{"model":', b'"m"}']))
    link.head(r, 200, "text/event-stream", "gzip")
    link.chunk(r, 111, b"data: 1\n\n")
    link.chunk(r, 222, b"data: 2\n\n")
    link.finish(r, "ok", None)
    link.flush()
    assert bk.writes == writes + 1
    assert bk.kinds() == [BEGIN, HEAD, CHUNK, CHUNK, FINISH]
    assert {f[1] for f in bk.frames if f[0] != STATS} == {r.seq}
    doc, body = split_begin(bk.of(BEGIN)[0][3])
    assert (doc["rid"], doc["m"], doc["p"], doc["wh"], doc["h"], doc["size"]) == (
        r.request_id, "POST", CHAT, "wl", {"x-team": "a"}, len(body),
    )  # fmt: skip
    assert body == b'{"model":"m"}' and "shed" not in doc
    assert orjson.loads(bk.of(HEAD)[0][3]) == [200, "text/event-stream", "gzip"]
    assert [(f[2], f[3]) for f in bk.of(CHUNK)] == [(111, b"data: 1\n\n"), (222, b"data: 2\n\n")]
    assert orjson.loads(bk.of(FINISH)[0][3]) == ["ok", None, 0, 0, 0, False, None]
    await link.close()


async def test_a_body_over_capture_max_bytes_is_sent_by_its_head_and_not_counted_shed() -> None:
    link, bk = _attached(capture=1000)
    r = link.begin("POST", CHAT, {}, None, _body(SCAN_BYTES + 10))
    link.flush()
    doc, body = split_begin(bk.of(BEGIN)[0][3])
    assert (len(body), doc["size"], "shed" in doc, r.shed, link.shed) == (
        SCAN_BYTES, SCAN_BYTES + 10, False, False, {"chunk": 0, "body": 0},
    )  # fmt: skip
    await link.close()


async def test_past_the_soft_limit_a_large_body_is_shed_to_its_head_and_its_request_flagged() -> None:
    link, bk = _attached(soft=SCAN_BYTES + 100, hard=1 << 30, capture=1 << 30)
    small = link.begin("POST", CHAT, {}, None, _body(SCAN_BYTES))  # over the soft limit too, but not above a head
    big = link.begin("POST", CHAT, {}, None, _body(SCAN_BYTES + 1))
    link.flush()
    (_, small_body), (big_doc, big_body) = (split_begin(f[3]) for f in bk.of(BEGIN))
    assert len(small_body) == SCAN_BYTES and not small.shed
    assert (len(big_body), big_doc.get("shed"), big.shed) == (SCAN_BYTES, True, True)
    assert (link.shed, link.shed_requests) == ({"chunk": 0, "body": 1}, 1)
    await link.close()


async def test_past_the_soft_limit_chunks_are_shed_from_the_first_one_on_and_counted() -> None:
    link, bk = _attached(soft=100, hard=1 << 20)
    r = link.begin("POST", CHAT, {}, None, _body(0))
    link.flush()
    link.chunk(r, 1, b"a" * 200)  # the buffer was under the limit: sent
    link.chunk(r, 2, b"b")  # now over it: shed, and every later chunk of this request too
    link.flush()
    link.chunk(r, 3, b"c")  # room again, but the stream already has a hole
    link.finish(r, "ok", None)
    link.flush()
    assert [f[3] for f in bk.of(CHUNK)] == [b"a" * 200]
    assert (link.shed, link.shed_requests, r.shed) == ({"chunk": 2, "body": 0}, 1, True)
    assert orjson.loads(bk.of(FINISH)[0][3])[5] is True  # the record is flagged bookkeeping_shed
    await link.close()


async def test_a_congested_channel_sheds_chunks_even_with_an_empty_buffer() -> None:
    link, bk = _attached()
    r = link.begin("POST", CHAT, {}, None, _body(0))
    link.congested = True
    link.chunk(r, 1, b"x")
    link.flush()
    assert bk.of(CHUNK) == [] and r.shed
    await link.close()


async def test_past_the_hard_limit_a_new_request_is_not_handed_over_and_is_counted_lost() -> None:
    link, bk = _attached(soft=10, hard=100)
    first = link.begin("POST", CHAT, {}, None, _body(150))  # under the hard limit when it began
    second = link.begin("POST", CHAT, {}, None, _body(0))  # the first one's BEGIN is now past it
    assert not first.lost and (second.lost, second.cause) == (True, "backlog")
    link.head(second, 200, None, None)
    link.finish(second, "ok", None)
    link.flush()
    assert bk.kinds() == [BEGIN]
    assert (link.lost, link.lost_by) == (1, {"backlog": 1})
    await link.close()


async def test_acknowledgements_count_written_and_sink_losses_once_each() -> None:
    link, _ = _attached()
    a = link.begin("POST", CHAT, {}, None, _body(0))
    b = link.begin("POST", CHAT, {}, None, _body(0))
    for r in (a, b):
        link.finish(r, "ok", None)
    link.received(frame(ACK, a.seq, 1) + frame(ACK, b.seq, 0))
    link.received(frame(ACK, a.seq, 1) + frame(ACK, b.seq, 0) + frame(ACK, 9999, 1))  # repeated or unknown: no effect
    assert (link.written, link.lost, link.lost_by, b.lost) == (1, 1, {"sink": 1}, True)
    assert link.final()["finished"] == link.written + link.lost
    await link.close()


async def test_health_frames_set_whether_records_can_be_written() -> None:
    link, _ = _attached()
    link.received(frame(HEALTH, 0, 0))
    assert not link.healthy
    # a frame can arrive in pieces of any size
    whole = frame(HEALTH, 0, 1)
    link.received(whole[:3])
    assert not link.healthy
    link.received(whole[3:])
    assert link.healthy
    await link.close()


async def test_a_dead_bookkeeper_loses_what_it_held_finished_now_and_in_flight_when_it_finishes() -> None:
    link, _ = _attached()
    done = link.begin("POST", CHAT, {}, None, _body(0))
    link.finish(done, "ok", None)
    acked = link.begin("POST", CHAT, {}, None, _body(0))
    link.finish(acked, "ok", None)
    link.received(frame(ACK, acked.seq, 1))
    running = link.begin("POST", CHAT, {}, None, _body(0))
    link.gone("test")
    assert (link.alive, link.healthy, link.lost, link.doubtful) == (False, False, 1, [done.request_id])
    link.finish(running, "ok", None)
    link.gone("again")  # only the first counts
    after = link.begin("POST", CHAT, {}, None, _body(0))
    link.finish(after, "ok", None)
    assert link.lost_by == {"bookkeeper_died": 2, "no_bookkeeper": 1}
    f = link.final()
    assert (f["finished"], f["written"], f["lost"]) == (4, 1, 3)


async def test_bytes_that_are_not_frames_end_the_channel() -> None:
    link, _ = _attached()
    r = link.begin("POST", CHAT, {}, None, _body(0))
    link.received(frame(0, 0, 0))  # kind 0 is no frame
    assert not link.alive
    link.finish(r, "ok", None)
    assert link.lost_by == {"bookkeeper_died": 1}


async def test_a_failing_send_ends_the_channel_and_relaying_goes_on() -> None:
    link = _link()
    bk = FakeBookkeeper(link, fail=True)
    link.attach_local(bk.send)
    r = link.begin("POST", CHAT, {}, None, _body(0))
    link.flush()
    assert not link.alive
    link.finish(r, "ok", None)
    assert link.lost_by == {"bookkeeper_died": 1}


async def test_refusals_are_sent_with_their_status_while_attached_only() -> None:
    link, bk = _attached()
    link.refused(413)
    link.flush()
    assert [(f[0], f[2]) for f in bk.of(REFUSED)] == [(REFUSED, 413)]
    await link.close()
    link.refused(408)  # closed: nothing, and no error
    assert len(bk.of(REFUSED)) == 1


async def test_a_query_is_answered_by_the_bookkeeper_after_the_relays_counters() -> None:
    link = _link()
    bk = FakeBookkeeper(link, answer=(200, "application/json", b'{"ok":1}'))
    link.attach_local(bk.send)
    link.flush()
    n = len(bk.frames)
    assert await link.query("/specproxy/status") == (200, "application/json", b'{"ok":1}')
    # the counters go first even when they have not changed since the last STATS
    assert [(f[0], f[3]) for f in bk.frames[n:]][1:] == [(QUERY, b"/specproxy/status")]
    assert bk.frames[n][0] == STATS
    await link.close()


@pytest.mark.parametrize("how", ["reply", "channel"])
async def test_a_bookkeeper_gone_during_a_query_gives_the_partial_answer(how: str) -> None:
    link = _link()
    bk = FakeBookkeeper(link, answer=(GONE, "", b"")) if how == "reply" else FakeBookkeeper(link, die_on_query=True)
    link.attach_local(bk.send)
    assert await link.query("/specproxy/nothing") == (
        503, "text/plain", b"the bookkeeping process is gone (being restarted)\n",
    )  # fmt: skip


async def test_without_a_bookkeeper_the_own_endpoints_answer_partially_from_the_relays_counters() -> None:
    link = _link()
    r = link.begin("POST", CHAT, {}, None, _body(0))
    link.finish(r, "ok", None)
    link.restarts = {"relay": 2}
    status, ctype, body = await link.query("/specproxy/status")
    doc = orjson.loads(body)
    assert (status, ctype, doc["partial"]) == (200, "application/json", True)
    assert "gone" in doc["why"]
    bkp = doc["bookkeeping"]
    assert (bkp["lost_records"], bkp["lost_by"], bkp["restarts"], bkp["relay_pids"]) == (
        1, {"no_bookkeeper": 1}, {"bookkeeper": 0, "relay": 2}, [bkp["pid"]],
    )  # fmt: skip
    status, ctype, body = await link.query("/specproxy/metrics")
    lines = body.decode().splitlines()
    assert (status, ctype.split(";")[0]) == (200, "text/plain")
    assert "specproxy_status_partial 1.0" in lines
    assert "specproxy_records_lost_total 1.0" in lines
    assert 'specproxy_process_restarts_total{role="relay"} 2.0' in lines
    assert 'specproxy_bookkeeping_shed_total{kind="chunk"} 0.0' in lines


class FakeTransport:
    """What _SocketSide asks of its transport when the channel is made."""

    def __init__(self) -> None:
        self.high: int | None = None
        self.written: list[bytes] = []

    def set_write_buffer_limits(self, high: int) -> None:
        self.high = high

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        pass


async def test_the_socket_side_turns_flow_control_into_congestion_and_a_closed_channel_into_loss() -> None:
    link, _ = _attached(soft=4096)
    side = _SocketSide(link)
    t = FakeTransport()
    side.connection_made(t)  # type: ignore[arg-type]
    assert t.high == 4096  # the loop pauses writing past the soft limit
    side.pause_writing()
    assert link.congested
    side.resume_writing()
    assert not link.congested
    side.data_received(frame(HEALTH, 0, 0))
    assert not link.healthy
    r = link.begin("POST", CHAT, {}, None, _body(0))
    link.finish(r, "ok", None)
    side.connection_lost(None)
    assert side.closed.done() and not link.alive
    assert link.lost_by == {"bookkeeper_died": 1}


@pytest.mark.parametrize("exc", [None, ConnectionResetError("reset")])
async def test_the_socket_side_closes_once_whatever_ended_it(exc: Exception | None) -> None:
    link, _ = _attached()
    side = _SocketSide(link)
    side.connection_lost(exc)
    side.connection_lost(exc)
    assert side.closed.done() and not link.alive
