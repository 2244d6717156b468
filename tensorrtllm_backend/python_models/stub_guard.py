"""Kill this Triton python stub if it outlives tritonserver.

The stub exits by itself when its parent dies, unless a Python thread is inside an IPC call to
the (now dead) parent at that moment: the call never returns, holds the GIL, and the stub's own
shutdown deadlocks behind it (seen here with a pb_utils Metric.set() in flight: the orphan stayed
forever). No Python-level watchdog can run without the GIL, so the guard is a tiny /bin/sh
process: once the stub's parent changes (tritonserver gone) it waits `grace_s` for a normal
exit, then SIGKILLs the stub. It ends on its own when the stub ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess

_SCRIPT = """
stub=$1 parent=$2 grace=$3
while [ -e /proc/$stub ]; do
  read -r _ _ state ppid _ < /proc/$stub/stat || exit 0
  [ "$state" = Z ] && exit 0
  if [ "$ppid" != "$parent" ]; then
    sleep "$grace"
    kill -9 "$stub" 2>/dev/null
    exit 0
  fi
  sleep 1
done
"""


def start_orphan_guard(grace_s: float = 10.0) -> subprocess.Popen[bytes] | None:
    """Start the guard for the current process (the stub); None where it cannot run."""
    shell = shutil.which("sh") or "/bin/sh"
    if not os.path.exists(f"/proc/{os.getpid()}/stat") or not os.path.exists(shell):
        return None
    return subprocess.Popen(
        [
            shell,
            "-c",
            _SCRIPT,
            "triton-stub-orphan-guard",
            str(os.getpid()),
            str(os.getppid()),
            str(grace_s),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


def stop_orphan_guard(guard: subprocess.Popen[bytes] | None) -> None:
    if guard is None:
        return
    guard.kill()
    try:
        guard.wait(timeout=2)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass
