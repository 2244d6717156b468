"""Read why Triton could not load a model out of its log, and whether starting it again can help.

A model whose model.py cannot import its dependencies, whose config.pbtxt does not parse, or
whose `initialize` raises fails the same way at every start: restarting tritonserver for it only
loops. Out-of-memory is the exception (the memory of a previous tritonserver may not be released
yet), so such a failure stays a reason to try again.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .install import TritonModelLoadError

_FAILURES = (
    re.compile(r"failed to load '(?P<model>[^']+)' version \d+: (?P<reason>.+)"),
    re.compile(r"Poll failed for model directory '(?P<model>[^']+)': (?P<reason>.+)"),
    re.compile(r"failed to load model '(?P<model>[^']+)': (?P<reason>.+)"),
)
_TRANSIENT = re.compile(r"out of memory|\bOOM\b|CUDA_ERROR_OUT_OF_MEMORY", re.IGNORECASE)
MAX_REASON_CHARS = 600


@dataclass(frozen=True)
class LoadFailure:
    model: str
    reason: str  # the first lines of Triton's message, without the Python traceback

    @property
    def deterministic(self) -> bool:
        return not _TRANSIENT.search(self.reason)

    def __str__(self) -> str:
        return f"model '{self.model}' failed to load: {self.reason}"


def _clean(reason: str) -> str:
    """Triton logs the message quoted with escaped newlines; a Python error is followed by
    "At:" and the traceback, which the model's log already has."""
    text = reason.strip().removesuffix('"').replace("\\n", "\n").replace('\\"', '"')
    text = text.split("\n\nAt:", 1)[0].strip()
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 3] + "..."
    return text


def parse_load_failures(log_text: str) -> list[LoadFailure]:
    """Every model-load failure of a Triton log, one per model (the last wins)."""
    found: dict[str, LoadFailure] = {}
    for line in log_text.splitlines():
        for pattern in _FAILURES:
            match = pattern.search(line)
            if match:
                model = match["model"]
                found[model] = LoadFailure(model, _clean(match["reason"]))
                break
    return list(found.values())


def read_load_failures(log_path: Path, max_bytes: int = 1024 * 1024) -> list[LoadFailure]:
    """parse_load_failures of the end of a log file (empty if it cannot be read)."""
    try:
        with log_path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - max_bytes))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    return parse_load_failures(text)


def deterministic_failures(failures: list[LoadFailure]) -> list[LoadFailure]:
    """The failures that would repeat at the next start (all of them, unless one is transient:
    then the whole start may succeed once the transient cause is gone)."""
    if not failures or any(not failure.deterministic for failure in failures):
        return []
    return failures


_ERROR_LINE = re.compile(r"^E\d{4} |error:|Poll failed|failed to load|UNAVAILABLE", re.IGNORECASE)


def log_tail(path: Path, lines: int = 40) -> str:
    """The end of Triton's log for error messages: its error lines first (the cause tends to
    scroll away behind the options table), then the last lines without the table."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 256 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    all_lines = text.splitlines()
    errors = [line for line in all_lines if _ERROR_LINE.search(line)]
    body = [line for line in all_lines if not line.startswith(("|", "+--"))]
    tail = body[-lines:]
    picked = [line for line in errors[-10:] if line not in tail]
    return "\n".join([*picked, *(["..."] if picked else []), *tail])


def log_excerpt(path: Path) -> str:
    """The end of Triton's log, introduced, for an error message."""
    return f"Last lines of its log ({path}):\n{log_tail(path)}"


def raise_if_a_model_failed(process: subprocess.Popen[bytes], log_path: Path) -> None:
    """TritonModelLoadError when the log shows models that failed to load for good (a start
    again would fail the same way)."""
    failures = deterministic_failures(read_load_failures(log_path))
    if not failures:
        return
    try:  # tritonserver normally exits on its own right after: let its log end
        code: int | None = process.wait(timeout=3)
    except subprocess.TimeoutExpired:
        code = None
    what = (
        "tritonserver is not ready"
        if code is None
        else f"tritonserver exited with code {code} before it was ready"
    )
    reasons = "\n".join(f"- {failure}" for failure in failures)
    raise TritonModelLoadError(
        f"{what}: {len(failures)} model(s) failed to load, and starting again would fail the "
        f"same way:\n{reasons}\n{log_excerpt(log_path)}"
    )
