"""Make a Triton python-backend stub exit when its tritonserver dies.

A stub whose tritonserver was SIGKILLed can linger (seen here: minutes, while a model thread is
busy). Each of our model.py files calls :func:`exit_with_parent` in ``initialize``: a daemon
thread notices the re-parenting and ends the process.
"""

from __future__ import annotations

import os
import threading
import time

_started = False


def exit_with_parent(poll_s: float = 1.0) -> None:
    """Idempotent; costs one wake-up per `poll_s`."""
    global _started
    if _started:
        return
    _started = True
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
