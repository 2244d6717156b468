"""The soak script (scripts/soak.py) reduced for CI: 200 concurrent streams, 1000 requests, on the
synthetic engine; nothing lost, short, duplicated or reordered, and its figures are printed."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import BentoServer  # tests/integration/conftest.py

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def soak_server(module_bento_launcher: Callable[..., BentoServer], synthetic_model: str):
    return module_bento_launcher(synthetic_model, wait=True)


def run_soak(server: BentoServer, model: str, *extra: str) -> tuple[int, str]:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "soak.py"), "--url", server.url, "--model", model,
         "--concurrency", "200", "--total", "1000", "--max-tokens", "16", "--deadline", "60",
         *extra],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    return completed.returncode, completed.stdout + completed.stderr


def figure(output: str, name: str) -> int:
    match = re.search(rf"^{re.escape(name)}\s+(\d+)", output, re.MULTILINE)
    assert match, f"{name!r} missing from the soak table:\n{output}"
    return int(match.group(1))


@pytest.mark.parametrize("mode", ["keepalive", "new-connections"])
def test_reduced_soak_loses_nothing(soak_server: BentoServer, synthetic_model: str, mode) -> None:
    extra = ("--no-keepalive",) if mode == "new-connections" else ()
    code, output = run_soak(soak_server, synthetic_model, *extra)
    print(output)
    for name in ("lost", "short", "duplicated/reordered"):
        assert figure(output, name) == 0, output
    assert figure(output, "ok") == 1000
    assert "RSS worker MiB before/after" in output and "RSS triton MiB before/after" in output
    assert code == 0 and "SOAK OK" in output, output


def test_soak_judge_classifies_each_failure() -> None:
    """The checker is not vacuous: short, duplicated and reordered texts are each caught."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import soak
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    tally = soak.Tally()
    expected = "one two three\ufffd"
    for got in (expected, "one two three", "one two", "one one two three", "two one three", ""):
        soak.judge(tally, expected, got, 0)
    assert (tally.ok, tally.short, tally.wrong) == (2, 2, 2)
