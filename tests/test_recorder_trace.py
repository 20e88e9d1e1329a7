"""One request's trace (specproxy.recorder.trace): what it tells the counter ledger per read (the first
token-bearing chunk is the prefill, later ones decode steps; several in one read go together), when it calls
on_first_token, and a passthrough request that is never read."""

from __future__ import annotations

from specproxy.recorder.trace import RequestMeta, Trace

CHAT = "/v1/chat/completions"


class FakeLedger:
    """Takes what CounterLedger.record_read takes."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, list[int], int, bool, bool]] = []

    def record_read(self, rid: str, tokens: list[int], t_ns: int, *, exact: bool, first_decode: bool) -> None:
        self.reads.append((rid, tokens, t_ns, exact, first_decode))


def _ev(data: str) -> bytes:
    return f"data: {data}\n\n".encode()


def _text(s: str, usage: int | None = None) -> bytes:
    u = f',"usage":{{"prompt_tokens":5,"completion_tokens":{usage}}}' if usage is not None else ""
    return _ev(f'{{"choices":[{{"index":0,"delta":{{"content":"{s}"}}}}]{u}}}')


def _trace(passthrough: bool = False) -> tuple[Trace, FakeLedger, list[int]]:
    ledger = FakeLedger()
    firsts: list[int] = []
    meta = RequestMeta("POST", CHAT, "chat", request_id="rid", start_ns=0)
    t = Trace(
        meta,
        tokenizer=None,
        keep_text=False,
        ledger=ledger,  # type: ignore[arg-type]
        passthrough=passthrough,
        on_first_token=lambda: firsts.append(1),
    )
    return t, ledger, firsts


def test_reads_before_the_response_head_are_ignored() -> None:
    t, ledger, firsts = _trace()
    t.feed(1, _text("early"))
    assert (ledger.reads, firsts, t.token_chunks) == ([], [], 0)


def test_the_first_token_read_is_the_prefill_and_later_reads_are_decode_steps() -> None:
    t, ledger, firsts = _trace()
    t.response_started(200, "text/event-stream", t_ns=5)
    assert (t.status, t.headers_ns) == (200, 5)
    t.feed(10, _ev('{"choices":[{"index":0,"delta":{"role":"assistant"}}]}'))  # no token: nothing told
    assert (ledger.reads, firsts) == ([], [])
    t.feed(20, _text("Hello"))
    assert firsts == [1]
    t.feed(30, _text(" big") + _text(" world"))  # two steps in one read: one call with both
    t.feed(40, _ev("[DONE]"))
    assert ledger.reads == [("rid", [1], 20, False, False), ("rid", [1, 1], 30, False, True)]
    assert (t.token_chunks, firsts) == (3, [1])  # on_first_token once only


def test_server_counts_make_the_reads_exact() -> None:
    t, ledger, _ = _trace()
    t.response_started(200, "text/event-stream")
    t.feed(20, _text("Hello", usage=1))
    t.feed(30, _text(" big world", usage=4))  # cumulative usage: this step brought 3
    assert ledger.reads == [("rid", [1], 20, True, False), ("rid", [3], 30, True, True)]


def test_without_a_ledger_the_chunks_are_still_counted() -> None:
    meta = RequestMeta("POST", CHAT, "chat", start_ns=0)
    t = Trace(meta, tokenizer=None, keep_text=False, ledger=None)
    t.response_started(200, "text/event-stream")
    t.feed(20, _text("a") + _text("b"))
    assert t.token_chunks == 2


def test_prefill_over_calls_its_waiter_once_even_when_no_token_came() -> None:
    t, _, firsts = _trace()
    t.prefill_over()
    t.prefill_over()
    assert firsts == [1]


def test_a_passthrough_request_is_never_read() -> None:
    t, ledger, _ = _trace(passthrough=True)
    t.response_started(200, "text/event-stream", t_ns=7)
    t.feed(20, _text("Hello"))
    assert (t.status, t.headers_ns, t.timeline, ledger.reads, t.token_chunks) == (200, 7, None, [], 0)


def test_request_ids_are_16_hex_and_distinct() -> None:
    a, b = RequestMeta("POST", CHAT, "w"), RequestMeta("POST", CHAT, "w")
    assert a.request_id != b.request_id
    assert len(a.request_id) == 16 and int(a.request_id, 16) >= 0
