"""Which records are the same request in two configurations' runs, so that their speedup can be paired.

Two ways, tried in this order:

- **the same request**: the same workload and the same request body, the ``model`` field aside (each
  configuration may serve its model under its own name). ``matrix`` sends every configuration the same requests in
  the same order, ``run`` with the same workload files and seed sends the same ones, and a replay re-sends its
  recording's bodies: all of them pair this way, from the body every record captures by default
  (``--capture request``). Repeats of one body are one request: its figure is their median.
- **a replay or a shadow**: ``replay_of`` names the recorded request a replay re-sent, ``shadow_of`` the live
  request a proxy's shadow copied (``--shadow``: its body was set to stream, so it is not the same body); the
  recording itself pairs by its own ``request_id``. Also for runs recorded with ``--capture none``, which keep no
  bodies.

Pure.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from specproxy.core.record import Record

BY_BODY = "same request"
BY_REPLAY = "replay_of"  # or shadow_of


def body_key(rec: Record) -> str | None:
    """The workload and a digest of the captured body without its ``model``; None when no body was captured."""
    body: Any = rec["request"]
    if body is None:
        return None
    if isinstance(body, dict) and "model" in body:
        body = {k: v for k, v in body.items() if k != "model"}
    try:
        raw = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not JSON (a hand-edited file): unpaired
        return None
    return f"{rec['workload']}:{hashlib.blake2b(raw, digest_size=12).hexdigest()}"


def replay_key(rec: Record) -> str:
    return rec["replay_of"] or rec["shadow_of"] or rec["request_id"]
