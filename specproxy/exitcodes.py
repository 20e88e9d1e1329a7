"""Exit codes of every command, defined once (docs/loadgen.md documents them)."""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1  # the command ran and found a failure (e.g. requests failed, target unreachable mid-run)
EXIT_USAGE: Final = 2  # bad arguments or unreadable input: nothing was run
EXIT_SIGINT: Final = 130  # 128 + SIGINT, the shell's convention: stopped by Ctrl-C, what was measured is kept
EXIT_SIGTERM: Final = 143  # 128 + SIGTERM, likewise
EXIT_UNAVAILABLE: Final = 69  # sysexits' EX_UNAVAILABLE: a package registry needed for a set-up cannot be reached
