"""The HTTP headers specproxy itself reads or adds, and how long it keeps idle connections, named once for the proxy
and the load generator alike."""

from __future__ import annotations

from typing import Final

WORKLOAD_HEADER: Final = "X-Specproxy-Workload"  # names a request's workload; the proxy strips it before relaying
REQUEST_ID_HEADER: Final = "X-Specproxy-Request-Id"  # the proxy's id of a relayed request, on every response

# How long a client of an engine keeps an idle connection for the next request. Engines close idle keep-alive
# connections themselves: vLLM after VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s, its uvicorn's timeout_keep_alive), SGLang
# after uvicorn's default (5 s). A request sent on a connection just as the engine closes it fails before any response
# ("server disconnected"), and a POST is not retried: closing ours first leaves no such race. (aiohttp's default is 15
# s.)
CLIENT_KEEPALIVE_S: Final = 4.0
