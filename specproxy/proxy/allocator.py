"""The C allocator under the proxy's processes: one malloc arena each (glibc), so that memory a worker thread frees
is memory the event loop can use again.

glibc gives each thread that allocates while another holds the main arena an arena of its own (up to eight per core)
and keeps what it frees there. The bookkeeper runs work in threads (the live advice over its window every
``--advise-every``, the parse of a scrape, the record file's appends), and each refresh of the advice would grow the
thread's arena by megabytes, in steps, for minutes. Python holds the GIL around almost every allocation, so one arena
costs no contention worth the name. ``MALLOC_ARENA_MAX`` in the environment, when set, is the user's choice and is
left alone.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
ENV = "MALLOC_ARENA_MAX"


def one_arena() -> bool:
    """Limit this process (and the processes it forks later) to one malloc arena; whether it was done (glibc only,
    and not when ``MALLOC_ARENA_MAX`` is set)."""
    if ENV in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        return False
