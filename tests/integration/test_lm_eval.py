"""lm-evaluation-harness, unmodified, against a real `bentoml serve` of the demo model on each
token-id route: its own CLI runs a multiple-choice task (loglikelihood), a perplexity task
(loglikelihood_rolling) and a greedy generation task (generate_until), from tests/data/lm_eval
(local YAML over local JSONL, read offline), and logs every sample.

- `local-completions` with token-id requests and the server's tokenizer (`tokenizer_backend=remote`:
  GET /tokenizer_info, POST /tokenize, /detokenize), prompts in batches of 4 (lists of id lists);
- `local-completions` with text requests and the tokenizer's files (`tokenizer_backend=
  huggingface`), prompts in batches of 2 (lists of strings);
- `local-chat-completions` generating through /v1/chat/completions (`--apply_chat_template`).

Every loglikelihood lm-eval logs must equal transformers' on the stored checkpoint within 1e-3
(with the same is-greedy flag), and every greedy answer the direct greedy generation
(tests/lm_eval_reference.py). lm-eval runs from its own venv (scripts/install-lm-eval.sh, run by
scripts/test.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import bentoml
import httpx
import pytest

from tests.integration.conftest import start_bento_server
from tests.lm_eval_reference import Reference, stored_checkpoint

if TYPE_CHECKING:
    from conftest import BentoServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LM_EVAL = ROOT / ".lm-eval-venv" / "bin" / "lm_eval"
TASKS = ROOT / "tests" / "data" / "lm_eval"
CHOICE, PERPLEXITY, GENERATE = (
    "trtllm_demo_choice",
    "trtllm_demo_perplexity",
    "trtllm_demo_generate",
)
TOLERANCE = 1e-3
# lm-eval's max_length: the perplexity task's long document then takes several windows, and
# every request fits the demo model's max_input_len (256).
MAX_LENGTH = 128
LM_EVAL_TIMEOUT_S = 240
# The server each route serves the demo model on, and the fixture that packed it.
ROUTES = {
    "direct": ("demo_server", "demo_model"),
    "llmapi": ("llmapi_demo_server", "llmapi_demo_model"),
}


@dataclass
class Served:
    server: BentoServer
    model: str  # as /v1/models names it
    tokenizer_dir: Path  # the tokenizer the model was packed with
    reference: Reference
    # The same model served with text prompts taken as sent (started on first use).
    text_as_sent: Callable[[], BentoServer]

    def server_for(self, mode: Mode) -> BentoServer:
        return self.text_as_sent() if mode.text_as_sent else self.server


@dataclass(frozen=True)
class Mode:
    """How lm-eval talks to the service."""

    name: str
    lm_eval_model: str
    path: str
    args: Callable[[Served], dict[str, object]] = lambda served: {}
    options: tuple[str, ...] = ()
    token_prompts: bool = False  # completions get lm-eval's token ids, else text
    # Served with TRTLLM_COMPLETIONS_ADD_SPECIAL_TOKENS=false: lm-eval's text is its own tokens
    # decoded, and its scores count them alone (a server that adds a BOS to the text shifts every
    # loglikelihood by one token, vLLM's as ours).
    text_as_sent: bool = False
    chat: bool = False


TOKENS_REMOTE = Mode(
    "tokens-remote", "local-completions", "/v1/completions",
    lambda served: {"tokenizer_backend": "remote", "tokenized_requests": True,
                    "max_length": MAX_LENGTH},
    ("--batch_size", "4"), token_prompts=True,
)  # fmt: skip
TEXT_HUGGINGFACE = Mode(
    "text-huggingface", "local-completions", "/v1/completions",
    lambda served: {"tokenizer_backend": "huggingface", "tokenizer": served.tokenizer_dir,
                    "tokenized_requests": False, "max_length": MAX_LENGTH},
    ("--batch_size", "2"), text_as_sent=True,
)  # fmt: skip
CHAT = Mode(
    "chat",
    "local-chat-completions",
    "/v1/chat/completions",
    options=("--apply_chat_template",),
    chat=True,
)


@pytest.fixture(scope="module")
def lm_eval() -> Path:
    if not LM_EVAL.exists():
        pytest.skip(
            f"lm-eval is not installed in {LM_EVAL.parents[1].name}: run scripts/install-lm-eval.sh "
            "(scripts/test.sh runs it)"
        )
    return LM_EVAL


@pytest.fixture(scope="module", params=list(ROUTES))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """The demo model on each token-id route, with the reference on its stored checkpoint."""
    server_fixture, model_fixture = ROUTES[request.param]
    server: BentoServer = request.getfixturevalue(server_fixture)
    tag = request.getfixturevalue(model_fixture)
    root = Path(bentoml.models.get(tag).path)
    models = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]
    tokenizer_dir = root / "tokenizer"
    reference = Reference(stored_checkpoint(root), tokenizer_dir)
    started: list[BentoServer] = []

    def text_as_sent() -> BentoServer:
        if not started:
            env = {"TRTLLM_COMPLETIONS_ADD_SPECIAL_TOKENS": "false"}
            started.append(start_bento_server(tag, tmp_path_factory.mktemp("as-sent"), env))
        return started[0]

    yield Served(server, models[0]["id"], tokenizer_dir, reference, text_as_sent)
    for each in started:
        each.stop()


def run_lm_eval(
    lm_eval: Path, served: Served, mode: Mode, tasks: list[str], out: Path
) -> dict[str, list[dict[str, Any]]]:
    """lm-eval's CLI on `tasks`; the samples it logged, by task. No retries: a retried 5xx would
    hide exactly the failures this test looks for."""
    args = {
        "base_url": served.server_for(mode).url + mode.path,
        "model": served.model,
        "max_retries": 1,
        "timeout": 120,
        **mode.args(served),
    }
    command = [
        str(lm_eval), "run", "--model", mode.lm_eval_model,
        "--model_args", ",".join(f"{key}={value}" for key, value in args.items()),
        "--tasks", ",".join(tasks), "--include_path", str(TASKS),
        "--log_samples", "--output_path", str(out), *mode.options,
    ]  # fmt: skip
    # Offline, with the datasets cache in the test's directory; the tasks' data_files are
    # relative to their folder.
    env = {
        **os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(out / "hf-home"),
    }  # fmt: skip
    done = subprocess.run(
        command, cwd=TASKS, env=env, capture_output=True, text=True, timeout=LM_EVAL_TIMEOUT_S
    )
    if done.returncode != 0:
        output = done.stdout + done.stderr
        refusals = [line for line in output.splitlines() if "API request failed" in line]
        raise AssertionError(
            f"lm_eval ({mode.name}) exited {done.returncode}; the server answered:\n"
            + "\n".join(refusals[:3])
            + "\n--- lm_eval's last lines ---\n"
            + "\n".join(output.splitlines()[-15:])
        )
    samples: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        (path,) = out.rglob(f"samples_{task}_*.jsonl")
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        documents = (TASKS / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()
        assert len(rows) == len(documents), f"{task}: {len(rows)} samples of {len(documents)}"
        samples[task] = sorted(rows, key=lambda row: row["doc_id"])
    return samples


def requests_of(sample: dict[str, Any]) -> list[tuple[dict[str, Any], Any]]:
    """(arguments, response) of each request lm-eval made for a sample (one per choice)."""
    arguments = [sample["arguments"][f"gen_args_{i}"] for i in range(len(sample["arguments"]))]
    return [(args, resp[0]) for args, resp in zip(arguments, sample["resps"], strict=True)]


@pytest.mark.parametrize("mode", [TOKENS_REMOTE, TEXT_HUGGINGFACE], ids=lambda mode: mode.name)
def test_loglikelihoods_equal_transformers(
    lm_eval: Path, served: Served, mode: Mode, tmp_path: Path
) -> None:
    samples = run_lm_eval(lm_eval, served, mode, [CHOICE, PERPLEXITY], tmp_path)
    reference = served.reference
    compared, wrong = 0, []
    for sample in samples[CHOICE]:
        requests = requests_of(sample)
        assert len(requests) == len(sample["doc"]["choices"])
        for args, (logprob, greedy) in requests:
            want = reference.loglikelihood(args["arg_0"], args["arg_1"], MAX_LENGTH)
            compared += 1
            if (
                abs(float(logprob) - want.logprob) > TOLERANCE
                or (greedy == "True") != want.is_greedy
            ):
                wrong.append(
                    f"{CHOICE} doc {sample['doc_id']} {args['arg_1']!r}: lm-eval "
                    f"({float(logprob):.5f}, {greedy}), transformers "
                    f"({want.logprob:.5f}, {want.is_greedy})"
                )
    for sample in samples[PERPLEXITY]:
        ((args, logprob),) = requests_of(sample)
        want_total = reference.loglikelihood_rolling(args["arg_0"], MAX_LENGTH)
        compared += 1
        if abs(float(logprob) - want_total) > TOLERANCE:
            wrong.append(
                f"{PERPLEXITY} doc {sample['doc_id']}: lm-eval {float(logprob):.5f}, "
                f"transformers {want_total:.5f}"
            )
    assert not wrong, f"{len(wrong)} of {compared} loglikelihoods differ:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    "mode", [TOKENS_REMOTE, TEXT_HUGGINGFACE, CHAT], ids=lambda mode: mode.name
)
def test_greedy_answers_equal_direct_generation(
    lm_eval: Path, served: Served, mode: Mode, tmp_path: Path
) -> None:
    (samples,) = run_lm_eval(lm_eval, served, mode, [GENERATE], tmp_path).values()
    reference = served.reference
    wrong = []
    for sample in samples:
        ((args, answer),) = requests_of(sample)
        context, kwargs = args["arg_0"], args["arg_1"]
        max_tokens = kwargs["max_gen_toks"]
        stop = list(kwargs["until"])
        if mode.chat:
            # lm-eval sends the chat as messages (logged as its JSON, in a list).
            prompt = reference.chat_prompt(json.loads(context[0]))
        elif mode.token_prompts:
            # lm-eval's ids, without special tokens, cut to leave room for the answer.
            prompt = reference.encode(context)[-(MAX_LENGTH - 1 - max_tokens) :]
        else:
            # A text prompt is encoded as the server was told to: as sent, no BOS added.
            prompt = reference.encode(context)
        if not mode.chat:
            stop.append(reference.tokenizer.eos_token)  # lm-eval adds the EOS text to `stop`
        want = reference.greedy(prompt, max_tokens, stop)
        if answer != want:
            wrong.append(f"doc {sample['doc_id']}: lm-eval {answer!r}, transformers {want!r}")
    assert not wrong, f"{len(wrong)} of {len(samples)} answers differ:\n" + "\n".join(wrong)
