"""The names the proxy's processes carry (``/proc/PID/comm``: ``ps -o comm``, ``top``), which the bench reads to split
the proxy's CPU into relaying and bookkeeping. Linux keeps 15 bytes of a name."""

from __future__ import annotations

from typing import Final

RELAY_PREFIX: Final = "sp-relay-"  # + the relay's number
BOOKKEEPER: Final = "sp-bookkeeper"
