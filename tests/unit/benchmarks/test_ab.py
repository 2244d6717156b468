"""benchmarks/ab.py's sides: a git ref checked out as a worktree (removed afterwards), or a folder
(an exported tree, on a machine without the history) used as it is; what a service's /metrics
says of its released connections."""

from __future__ import annotations

import subprocess
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from benchmarks.ab import Measured, Rounds, checkout, parse_args, released_connections, report
from benchmarks.bench_procs import ROOT
from benchmarks.bench_stats import summarize
from tensorrtllm_backend.triton.command import find_free_port


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


def test_each_api_is_a_target_of_each_side_compared_with_its_own() -> None:
    assert parse_args(["--base", "HEAD"]).apis == ["native"]
    assert parse_args(["--base", "HEAD", "--apis", "native, openai"]).apis == ["native", "openai"]
    with pytest.raises(SystemExit):
        parse_args(["--base", "HEAD", "--apis", "grpc"])
    rounds = Rounds()
    for target, rate in [
        ("base", 100.0), ("candidate", 99.0), ("base/openai", 80.0), ("candidate/openai", 84.0),
    ]:  # fmt: skip
        summary = summarize(target, "ab", 1, [], 1.0)
        summary.tokens_per_s = rate
        rounds.add(target, Measured(summary))
    table = report(rounds, [])
    assert "candidate / base " in table and "0.990 (0.990..0.990)" in table
    assert "candidate/openai / base/openai" in table and "1.050 (1.050..1.050)" in table


async def test_released_connections_add_up_every_worker_and_reason() -> None:
    port = find_free_port()
    metrics = (
        "# HELP trtllm_requests_total Finished requests by finish reason.\n"
        "# TYPE trtllm_requests_total counter\n"
        'trtllm_requests_total{api="native",finish_reason="length"} 90.0\n'
        'trtllm_requests_total{api="openai_chat",finish_reason="stop"} 10.0\n'
        "# HELP trtllm_connections_released_total Keep-alive connections closed.\n"
        "# TYPE trtllm_connections_released_total counter\n"
        "trtllm_connections_released_total 7.0\n"
    )

    async def handle(_: web.Request) -> web.Response:
        return web.Response(text=metrics)

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}"
            assert await released_connections(http, url) == (100.0, 7.0)
    finally:
        await runner.cleanup()
