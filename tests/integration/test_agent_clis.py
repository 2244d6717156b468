"""The coding-agent CLIs people run, unmodified, completing a real tool loop against `bentoml
serve`: Claude Code (the Messages API) and Codex CLI (the Responses API), headless, each at the
version scripts/install-agent-clis.sh pins.

The model is the scripted CPU engine (`pack_model.py --scripted`): asked by the user turn, it
calls the CLI's own shell tool in the packed template's tool-call format; given the tool's
result, it answers with it. The shell command computes a marker that the prompt does not contain,
so the marker in the CLI's final answer proves the whole loop ran: the request, the call, the
CLI running its tool, the result sent back, the answer. A logging proxy between the CLI and the
service records every exchange: each must be answered 2xx.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import pack  # tests/integration/conftest.py

from tensorrtllm_backend.triton.command import find_free_port

if TYPE_CHECKING:
    from conftest import BentoServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".agent-clis" / "node_modules" / ".bin"
MODEL = "trtllm-scripted-agents"
MARKER = "MARK-7431"
MARKER_COMMAND = "echo MARK-$((7000+431))"  # prints MARKER, which no prompt contains
TIMEOUT_S = 240


def cli(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        pytest.skip(
            f"{name} is not installed: run scripts/install-agent-clis.sh (needs node and npm; "
            "scripts/test.sh runs it)"
        )
    return path


@pytest.fixture(scope="module")
def scripted_model() -> str:
    """The scripted engine with room for a coding CLI's prompt (15-25k tokens of tools and
    instructions, and growing)."""
    return pack(
        "--scripted", "--name", MODEL, "--max-input-len", "131072", "--max-seq-len", "135168",
        "--max-batch-size", "8",
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(scripted_model: str, module_bento_launcher) -> BentoServer:
    return module_bento_launcher(scripted_model, wait=True)


@pytest.fixture
def proxy(server: BentoServer, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The logging proxy in front of the service: its URL, and the file of its exchanges."""
    log = tmp_path / "exchanges.jsonl"
    port = find_free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.agent_clients.logging_proxy", "--upstream", server.url,
         "--port", str(port), "--log", str(log)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == str(port), "the proxy did not start"
        yield f"http://127.0.0.1:{port}", log
    finally:
        process.terminate()
        process.wait(10)


def exchanges(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def run_cli(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM", "SSL_CERT_FILE")}
    return subprocess.run(
        command, env={**base, **env}, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip


def check_loop(result: subprocess.CompletedProcess, log: Path, path: str) -> None:
    seen = exchanges(log)
    report = f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}\n" + "\n".join(
        f"{e['method']} {e['path']} {e['status']} {e.get('answer', '')[:300]}" for e in seen
    )
    assert result.returncode == 0, report
    assert [e for e in seen if e["status"] >= 300] == [], report
    calls = [e for e in seen if e["path"].split("?")[0] == path]
    assert len(calls) >= 2, report  # the request that calls the tool, and the one after it
    assert MARKER in result.stdout, report


def test_claude_code_runs_its_bash_tool_and_answers(
    proxy: tuple[str, Path], tmp_path: Path
) -> None:
    claude = cli("claude")
    url, log = proxy
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    prompt = (
        "Print the marker. "
        f'CALL Bash {{"command": "{MARKER_COMMAND}", "description": "Print the marker"}}'
    )
    result = run_cli(
        [str(claude), "-p", prompt, "--allowedTools", "Bash", "--max-turns", "4"],
        {
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": "unused",
            "ANTHROPIC_MODEL": MODEL,
            "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
        work,
    )
    check_loop(result, log, "/v1/messages")
    first = exchanges(log)[0]["body"]
    # What Claude Code sends, served as its fields' policies say (docs/api.md).
    assert first["thinking"]["type"] == "adaptive" and "context_management" in first


def test_codex_runs_its_shell_tool_and_answers(proxy: tuple[str, Path], tmp_path: Path) -> None:
    codex = cli("codex")
    url, log = proxy
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "bento"\n\n[model_providers.bento]\n'
        f'name = "bento"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
        'env_key = "BENTO_API_KEY"\n'
    )
    prompt = f'Print the marker. CALL exec_command {{"cmd": "{MARKER_COMMAND}"}}'
    result = run_cli(
        [str(codex), "exec", "--skip-git-repo-check",
         "--dangerously-bypass-approvals-and-sandbox", prompt],
        {"HOME": str(home), "CODEX_HOME": str(home), "BENTO_API_KEY": "unused"},
        work,
    )  # fmt: skip
    check_loop(result, log, "/v1/responses")
    first = exchanges(log)[0]["body"]
    kinds = {tool.get("type") for tool in first["tools"]}
    assert {"namespace", "web_search"} <= kinds and first["reasoning"] is not None


PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch"


def test_a_custom_tool_call_round_trips_through_the_openai_client(server: BentoServer) -> None:
    """Codex's freeform tools (`type: custom`, e.g. apply_patch with a lark grammar), through
    the official `openai` client: the call comes back as a custom_tool_call whose input is the
    raw text, streamed with its input events, and its output sent back is answered."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    tool = {
        "type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
        "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'},
    }  # fmt: skip
    ask = f"CALL apply_patch {json.dumps({'input': PATCH})}"
    response = client.responses.create(model=MODEL, input=ask, tools=[tool], max_output_tokens=256)
    (call,) = [item for item in response.output if item.type == "custom_tool_call"]
    assert (call.name, call.input) == ("apply_patch", PATCH)
    events = list(
        client.responses.create(
            model=MODEL, input=ask, tools=[tool], max_output_tokens=256, stream=True
        )
    )
    done = [event for event in events if event.type == "response.custom_tool_call_input.done"]
    assert [event.input for event in done] == [PATCH]
    answer = client.responses.create(
        model=MODEL, tools=[tool], max_output_tokens=256,
        input=[
            {"type": "message", "role": "user", "content": ask},
            {"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch", "input": PATCH},
            {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done: hello.txt"},
        ],
    )  # fmt: skip
    assert "Done: hello.txt" in answer.output_text
