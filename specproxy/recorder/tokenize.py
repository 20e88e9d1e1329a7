"""``--tokenizer server``: a response's text counted once by the engine's own ``POST /tokenize``.

vLLM serves it at the root: ``{"model", "prompt", "add_special_tokens"}`` -> ``{"count", "max_model_len", "tokens"}``.
The recorder calls it from a record's finalisation, after the response ended: the relay never waits for it, and one
call per response (not per chunk) keeps the engine's API server out of the hot path. A failed call leaves the counts
of the local tokenizer, and says so.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from specproxy.core.timeline import TimelineResult, with_counted_total

log = logging.getLogger("specproxy.recorder")

# /tokenize calls in flight at once: records wait for their count rather than flood the engine's API server
CONCURRENCY = 4
TIMEOUT_S = 5.0  # a record waits this long at most for its count


class ServerTokenizer:
    def __init__(self, session: aiohttp.ClientSession, url: str, timeout_s: float = TIMEOUT_S) -> None:
        self._session = session
        self._url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._slots = asyncio.Semaphore(CONCURRENCY)
        self._warned = False

    async def recount(self, tl: TimelineResult, model: str | None) -> tuple[TimelineResult, bool]:
        """The timeline with its completion counted by the engine (or as it was), and whether the count failed."""
        if tl.token_source in ("usage", "token_ids", "none") or not tl.response_text:
            return tl, False  # exact already, or nothing was said
        if not tl.text_complete:
            return tl, True  # the text kept was cut (over 4 M characters): a count of part of it would mislead
        body: dict[str, Any] = {"prompt": tl.response_text, "add_special_tokens": False}
        if model is not None:
            body["model"] = model
        try:
            async with (
                self._slots,
                self._session.post(
                    self._url,
                    json=body,
                    headers={"Accept-Encoding": "identity"},  # the proxy's session does not inflate
                    timeout=self._timeout,
                ) as resp,
            ):
                answer = await resp.json(content_type=None) if resp.status == 200 else None
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            self._warn(type(e).__name__)  # not its text: that names the engine's address
            return tl, True
        count = answer.get("count") if isinstance(answer, dict) else None
        if count is None and isinstance(answer, dict) and isinstance(answer.get("tokens"), list):
            count = len(answer["tokens"])
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            self._warn(f"HTTP {status}, no count in the answer")
            return tl, True
        return with_counted_total(tl, count, "server_tokenize"), False

    def _warn(self, reason: str) -> None:
        if not self._warned:  # once: the same cause fails every request
            self._warned = True
            log.warning("the engine's /tokenize failed (%s): counts stay the local tokenizer's", reason)
