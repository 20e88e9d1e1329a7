"""A server that never becomes healthy and whose child ignores SIGTERM: ``specproxy matrix`` must still leave no
process behind (SIGTERM to the leader, then to the group, then SIGKILL). Writes both PIDs to the file named by its
first argument, then waits."""

from __future__ import annotations

import os
import subprocess
import sys
import time

CHILD = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)"

child = subprocess.Popen([sys.executable, "-c", CHILD])
with open(sys.argv[1], "w") as f:
    f.write(f"{child.pid} {os.getpid()}\n")
print("loading the model (forever)", flush=True)
time.sleep(120)
