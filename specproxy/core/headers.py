"""The HTTP headers specproxy itself reads or adds, named once for the proxy and the load generator alike."""

from __future__ import annotations

from typing import Final

WORKLOAD_HEADER: Final = "X-Specproxy-Workload"  # names a request's workload; the proxy strips it before relaying
REQUEST_ID_HEADER: Final = "X-Specproxy-Request-Id"  # the proxy's id of a relayed request, on every response
