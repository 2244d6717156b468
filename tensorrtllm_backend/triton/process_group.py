"""Ending tritonserver: its process group (the server and its Python stubs) goes together."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess

logger = logging.getLogger(__name__)


def terminate_group(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM tritonserver's process group, SIGKILL it after `timeout_s`; always reap."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        logger.warning("tritonserver did not exit after SIGTERM; killing its process group")
    # Python stubs share the group: kill whatever is left even if tritonserver itself exited.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
