"""Notice when a Python backend stub of a running tritonserver dies.

A stub that dies (out of memory, a crash: tritonserver 2.51's Python backend corrupts its heap
under some BLS loads) is never started again: its model fails every later request with "Stub
process '<instance>' is not healthy", and the requests it was serving wait forever. tritonserver
itself stays up, so the supervisor, which watches tritonserver's exit, would not see it. This reads
/proc, where a dead stub stays a zombie (tritonserver does not reap it) or disappears.
"""

from __future__ import annotations

import time
from pathlib import Path

# The kernel keeps 15 characters of an executable's name; a zombie has no command line left.
STUB_COMM = "triton_python_backend_stub"[:15]
_DEAD_STATES = {"Z", "X"}


def _stat(pid_dir: Path) -> tuple[str, str, int] | None:
    """(comm, state, parent pid) of one /proc/<pid> entry, None if it is gone."""
    try:
        text = (pid_dir / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ")"
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    return head.partition("(")[2], fields[0], int(fields[1])


def _model_of(pid_dir: Path, tries: int = 50) -> str:
    """The model a live stub serves: its first argument is <repository>/<model>/<version>/model.py.

    A process caught in exec has its new name before its new command line (the kernel sets the
    arguments' place after the name): an empty command line is read again, a few times."""
    for _ in range(tries):
        try:
            raw = (pid_dir / "cmdline").read_bytes()
        except OSError:
            return "?"
        if raw:
            break
        time.sleep(0.002)
    arguments = raw.split(b"\0")
    parts = Path(arguments[1].decode(errors="replace")).parts if len(arguments) > 1 else ()
    return parts[-3] if len(parts) >= 3 else "?"


def python_stubs(root_pid: int, proc: Path = Path("/proc")) -> dict[int, bool]:
    """Python backend stubs among the descendants of root_pid (tritonserver, or mpirun with its
    ranks), each with whether it is still alive.

    A stub's own descendants are not stubs, even when they carry its name: a model that forks
    (multiprocessing, or a subprocess in the moment between fork and exec) makes children named
    like the stub, and their normal exit must not count as a dead stub.
    """
    children: dict[int, list[int]] = {}
    stubs: dict[int, bool] = {}
    try:
        entries = list(proc.iterdir())
    except OSError:  # no /proc (not Linux): nothing to watch
        return {}
    for entry in entries:
        if not entry.name.isdigit():
            continue
        stat = _stat(entry)
        if stat is None:
            continue
        comm, state, parent = stat
        pid = int(entry.name)
        children.setdefault(parent, []).append(pid)
        if comm == STUB_COMM:
            stubs[pid] = state not in _DEAD_STATES
    found: dict[int, bool] = {}
    pending = list(children.get(root_pid, []))
    while pending:
        pid = pending.pop()
        if pid in stubs:
            found[pid] = stubs[pid]
        else:
            pending.extend(children.get(pid, []))
    return found


class StubWatch:
    """The stubs of one tritonserver run: `dead()` names each stub once ("<model> (pid N)"), at
    the first call that finds it dead (a zombie) or gone after an earlier call saw it alive.

    Scanning all of /proc takes milliseconds on a busy host, in a thread that shares the
    worker's GIL, so the full scan runs every `rescan_every` calls (to see stubs of models loaded
    later) and the other calls only look at the stubs already known.

    The watch notes the stubs alive when it is made, with their models: made as soon as
    tritonserver is ready, it can name a stub that dies before the first `dead()`.
    """

    def __init__(self, root_pid: int, proc: Path = Path("/proc"), rescan_every: int = 30) -> None:
        self.root_pid = root_pid
        self.proc = proc
        self.rescan_every = rescan_every
        self._calls = 0
        self._reported: set[int] = set()
        stubs = python_stubs(root_pid, proc)
        self._alive = {pid for pid, alive in stubs.items() if alive}
        # read while alive: a zombie has no command line
        self._models = {pid: _model_of(proc / str(pid)) for pid in self._alive}

    def _known_stubs(self) -> dict[int, bool]:
        stubs = {}
        for pid in self._alive:
            stat = _stat(self.proc / str(pid))
            if stat is not None and stat[0] == STUB_COMM:  # else gone, or its pid reused
                stubs[pid] = stat[1] not in _DEAD_STATES
        return stubs

    def dead(self) -> list[str]:
        rescan = self._calls % self.rescan_every == 0
        self._calls += 1
        stubs = python_stubs(self.root_pid, self.proc) if rescan else self._known_stubs()
        gone = {pid for pid in self._alive if pid not in stubs}
        zombies = {pid for pid, alive in stubs.items() if not alive}
        dead = sorted((gone | zombies) - self._reported)
        self._reported.update(dead)
        self._alive = {pid for pid, alive in stubs.items() if alive}
        for pid in self._alive - self._models.keys():
            self._models[pid] = _model_of(self.proc / str(pid))
        return [f"{self._models.get(pid, '?')} (pid {pid})" for pid in dead]
