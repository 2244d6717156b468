"""Run directories: named after their process; a new one removes those of processes that are
gone, and nothing of a live process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tensorrtllm_backend.serving.run_dir import make_run_dir, owner_pid


def a_gone_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def run_dir(base: Path, pid: int, suffix: str = "x1y2") -> Path:
    path = base / f"trtllm-run-{pid}-{suffix}"
    (path / "logs").mkdir(parents=True)
    (path / "logs" / "tritonserver.log").write_text("log\n")
    return path


def test_a_new_run_dir_is_named_after_its_process(tmp_path: Path) -> None:
    made = make_run_dir(tmp_path)
    assert made.parent == tmp_path and made.is_dir()
    assert owner_pid(made.name) == os.getpid()


def test_the_dirs_of_processes_that_are_gone_are_removed(tmp_path: Path) -> None:
    gone = run_dir(tmp_path, a_gone_pid())
    live_parent = run_dir(tmp_path, os.getppid())
    own = run_dir(tmp_path, os.getpid(), "earlier")
    unnamed = tmp_path / "trtllm-run-abc123"  # made before directories carried a pid
    unnamed.mkdir()
    other = tmp_path / "something-else-1"
    other.mkdir()
    made = make_run_dir(tmp_path)
    assert not gone.exists()
    assert live_parent.exists() and own.exists() and unnamed.exists() and other.exists()
    assert made.exists()


def test_owner_pid_reads_only_run_dir_names() -> None:
    assert owner_pid("trtllm-run-4242-abcd") == 4242
    assert owner_pid("trtllm-run-abcd") is None
    assert owner_pid("trtllm-run-4242") is None
    assert owner_pid("other-run-4242-abcd") is None
