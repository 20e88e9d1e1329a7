"""CPU per read of the two body readers, llhttp (:mod:`specproxy.proxy.llbody`) and Python (:class:`http1.Framed`),
on a chunked SSE stream as vLLM writes it: one event per chunk, one chunk per read (the relay's usual read), and
100 chunks per read (a saturated stream). ``python -m benchmarks.parsers [--sse FILE] [--rounds N]``.

The readers alternate round by round and the best round of each is kept, so a busy machine moves both alike.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from specproxy.proxy.http1 import CHUNKED, BodyReader, Framed
from specproxy.proxy.llbody import Body

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENT = (
    b'data: {"id":"chatcmpl-9bb197ed5446497e","object":"chat.completion.chunk","created":1795939919,"model":'
    b'"smollm2","choices":[{"index":0,"delta":{"content":" here"},"logprobs":null,"finish_reason":null,"token_ids":'
    b'null}],"usage":{"prompt_tokens":43,"total_tokens":46,"completion_tokens":3,"completion_tokens_details":null}}\n\n'
)


def _events(path: str | None) -> list[bytes]:
    if path is None:
        return [EVENT] * 100
    with open(path, "rb") as f:
        return [e + b"\n\n" for e in f.read().split(b"\n\n") if e.strip()]


def _round(make: Callable[[], BodyReader], reads: list[bytes], streams: int) -> float:
    """CPU ns per read over ``streams`` streams of ``reads``."""
    c0 = time.process_time_ns()
    for _ in range(streams):
        reader = make()
        for r in reads:
            reader.feed(r)
    return (time.process_time_ns() - c0) / (streams * len(reads))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.parsers", description=__doc__)
    ap.add_argument("--sse", help="an SSE capture (events separated by empty lines); default: one vLLM event x 100")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    chunks = [b"%x\r\n%b\r\n" % (len(e), e) for e in _events(args.sse)]
    cases = {"1 event per read": chunks, "100 events per read": [b"".join(chunks[:100])] * 10}
    readers: dict[str, Callable[[], BodyReader]] = {"python": lambda: Framed(CHUNKED, 0), "llhttp": lambda: Body(HEAD)}
    for case, reads in cases.items():
        best = {name: float("inf") for name in readers}
        for _ in range(args.rounds):
            for name, make in readers.items():
                best[name] = min(best[name], _round(make, reads, max(1, 20_000 // len(reads))))
        per = 100 if case.startswith("100") else 1
        line = ", ".join(f"{name} {ns / per:,.0f} ns" for name, ns in best.items())
        print(f"{case}: per event {line} ({best['python'] / best['llhttp']:.1f}x)")


if __name__ == "__main__":
    main()
