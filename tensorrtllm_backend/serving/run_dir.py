"""The worker's run directory: the localized model repository and tritonserver's logs.

A worker removes its run directory when it stops. One that is killed (SIGKILL, the OOM killer, a
lost container) cannot, so each directory is named after the process that made it, and a worker
that starts removes those whose process is gone. Its tritonserver died with it (parent-death
signal), so nothing reads them any more. A directory of a live process, or of another user, is
never touched.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "trtllm-run-"


def make_run_dir(base: Path | None = None) -> Path:
    """A new run directory for this process in `base` (the system's temporary directory), after
    removing the ones that processes now gone left there."""
    base = Path(base or tempfile.gettempdir())
    removed = sweep_abandoned(base)
    if removed:
        logger.info("removed %d run directories of services that are gone", removed)
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base))


def sweep_abandoned(base: Path) -> int:
    """Remove the run directories in `base` whose owning process no longer runs; how many."""
    removed = 0
    for path in base.glob(f"{PREFIX}*-*"):
        pid = owner_pid(path.name)
        if pid is None or pid == os.getpid() or _alive(pid):
            continue
        try:
            if path.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue  # removed meanwhile by another worker
        shutil.rmtree(path, ignore_errors=True)
        removed += not path.exists()
    return removed


def owner_pid(name: str) -> int | None:
    """The pid in a run directory's name, `trtllm-run-<pid>-<random>`; None for other names."""
    pid, _, rest = name.removeprefix(PREFIX).partition("-")
    return int(pid) if name.startswith(PREFIX) and pid.isdigit() and rest else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
