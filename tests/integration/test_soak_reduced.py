"""The soak script (scripts/soak.py) reduced for CI: 200 concurrent streams, 1000 requests, on the
synthetic engine; nothing lost, short, duplicated or reordered, and its figures are printed. And
its chaos mode reduced: 300 hostile and careless requests with tritonserver killed once."""

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


CHAOS_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def chaos_server(module_bento_launcher: Callable[..., BentoServer], slow_synthetic_model: str):
    """A server of its own: the chaos run kills its tritonserver."""
    return module_bento_launcher(
        slow_synthetic_model, {"TRTLLM_MAX_REQUEST_BYTES": str(CHAOS_LIMIT)}, wait=True
    )


def test_reduced_chaos_soak(chaos_server: BentoServer, slow_synthetic_model: str) -> None:
    """Clients that leave at random moments, bodies over the limit, malformed and invalid ones,
    and tritonserver SIGKILLed a third of the way through: every request that was not cancelled
    completes or fails cleanly, no client mistake gets a 5xx, nothing hangs, nothing stays in
    flight, the worker's RSS is back within 10%."""
    completed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "soak.py"), "--chaos", "--url", chaos_server.url,
         "--model", slow_synthetic_model, "--body-limit", str(CHAOS_LIMIT), "--total", "300",
         "--concurrency", "50", "--request-timeout", "60", "--deadline", "150"],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )  # fmt: skip
    output = completed.stdout + completed.stderr
    print(output)
    for name in ("wrong", "short", "hung", "5xx-for-mistake", "mistake-accepted", "unexpected"):
        assert figure(output, name) == 0, output
    assert figure(output, "ok") > 0 and figure(output, "cancelled") > 0, output
    assert figure(output, "refused") > 0, output
    assert re.search(r"^tritonserver killed\s+pid \d+", output, re.MULTILINE), output
    assert completed.returncode == 0 and "SOAK OK" in output, output


def test_chaos_judge_tells_clean_failures_from_bad_ones() -> None:
    """A complete answer must be whole; a stream cut with an error may be short, never wrong."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import soak
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    expected = "one two three"
    assert soak._judge_text(expected, expected, complete=True)[0] == "ok"
    assert soak._judge_text(expected, "one two", complete=True)[0] == "short"  # silently cut
    assert soak._judge_text(expected, "one two", complete=False)[0] == "failed-clean"
    assert soak._judge_text(expected, expected, complete=False)[0] == "short"  # no [DONE]
    assert soak._judge_text(expected, "two one", complete=False)[0] == "wrong"
