"""benchmarks/ab.py's sides: a git ref checked out as a worktree (removed afterwards), or a folder
(an exported tree, on a machine without the history) used as it is."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.ab import checkout, parse_args
from benchmarks.bench_procs import ROOT


def test_a_folder_is_used_as_it_is(tmp_path: Path) -> None:
    exported = tmp_path / "base"
    exported.mkdir()
    (exported / "service.py").write_text("")
    with checkout(str(exported), tmp_path / "work") as root:
        assert root == exported.resolve()
    assert (exported / "service.py").exists()


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_a_ref_is_a_worktree_removed_afterwards(tmp_path: Path) -> None:
    with checkout("HEAD", tmp_path) as root:
        assert (root / "benchmarks" / "ab.py").is_file()
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        )
        assert (
            head.stdout
            == subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout
        )
    assert not root.exists()


def test_workers_and_environments_are_parsed() -> None:
    args = parse_args(["--base", "HEAD", "--workers", "4", "--base-env", "A=1"])
    assert args.workers == 4 and args.base_env == {"A": "1"} and args.candidate_env == {}
