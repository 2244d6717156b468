"""vLLM's routes at the root as clients that tokenize remotely use them: `GET /tokenizer_info`
(what it answers, and that it never names the files' paths), and `/tokenize` and `/detokenize`
with exactly the requests lm-evaluation-harness 0.4.13's remote tokenizer sends, and with fields
they do not know. The routes run in the root app the service mounts, over the chat core of the
demo tokenizer (nothing is generated: Triton is never called)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
from starlette.testclient import TestClient

from tensorrtllm_backend.packing.demo import CHAT_TEMPLATE
from tensorrtllm_backend.serving.api_surface import root_app
from tensorrtllm_backend.serving.chat.core import ChatCore
from tensorrtllm_backend.serving.generation import EngineLimits, Generator
from tensorrtllm_backend.triton.client import TritonLLMClient

MAX_SEQ_LEN = 512
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture
def core(demo_tokenizer) -> ChatCore:
    client = TritonLLMClient.__new__(TritonLLMClient)  # never called: nothing is generated
    return ChatCore(Generator(client, demo_tokenizer, EngineLimits(256, MAX_SEQ_LEN)), "demo")


@pytest.fixture
def http(core: ChatCore) -> TestClient:
    return TestClient(root_app(lambda: core, lambda: None))


def tokenize(http: TestClient, body: dict[str, Any]) -> list[int]:
    response = http.post("/tokenize", json=body)
    assert response.status_code == 200, response.text
    tokens: list[int] = response.json()["tokens"]
    return tokens


def test_tokenizer_info_answers_what_a_remote_tokenizer_needs(
    http: TestClient, demo_tokenizer
) -> None:
    response = http.get("/tokenizer_info")
    assert response.status_code == 200
    assert response.json() == {
        "tokenizer_class": type(demo_tokenizer).__name__,  # as vLLM: the class that loaded it
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": None,
        # The demo tokenizer's post-processor adds <s>, whatever its add_bos_token attribute says.
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {"0": "<pad>", "1": "<s>", "2": "</s>"},
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": MAX_SEQ_LEN,  # the tokenizer says 2048; the engine takes 512
    }


def test_tokenizer_info_never_names_where_the_files_are(
    http: TestClient, core: ChatCore, demo_checkpoint: Path
) -> None:
    # The loaded tokenizer knows its directory; vLLM's answer would carry it (name_or_path).
    assert str(demo_checkpoint) in json.dumps(core.generator.tokenizer.init_kwargs, default=str)
    text = http.get("/tokenizer_info").text
    assert str(demo_checkpoint) not in text
    for loader_option in ("name_or_path", "tokenizer_file", "vocab_file", "local_files_only"):
        assert loader_option not in text


def test_the_remote_tokenizer_of_lm_eval_gets_its_answers(http: TestClient, demo_tokenizer) -> None:
    """lm-eval 0.4.13's RemoteTokenizer and check_remote_tokenizer_support, request by request:
    GET /tokenizer_info (must hold eos_token), {"prompt", "add_special_tokens": false} for every
    encode (its special tokens' ids too), {"tokens"} for every decode."""
    info = http.get("/tokenizer_info").json()
    assert "eos_token" in info
    assert tokenize(http, {"prompt": "test", "add_special_tokens": False}) == (
        demo_tokenizer.encode("test", add_special_tokens=False)
    )
    bos = tokenize(http, {"prompt": info["bos_token"], "add_special_tokens": False})
    eos = tokenize(http, {"prompt": info["eos_token"], "add_special_tokens": False})
    assert (bos[0], eos[0]) == (demo_tokenizer.bos_token_id, demo_tokenizer.eos_token_id)
    # A loglikelihood_rolling window starts with the prefix token; text requests decode it.
    ids = [bos[0], *demo_tokenizer.encode("Once upon a time", add_special_tokens=False)]
    decoded = http.post("/detokenize", json={"tokens": ids})
    assert decoded.status_code == 200
    assert decoded.json() == {"prompt": "<s>Once upon a time"}


def test_the_chat_template_renders_as_the_server_renders(http: TestClient) -> None:
    """A remote tokenizer renders chats with the template it was given, as lm-eval's does (a
    jinja2 environment, messages and add_generation_prompt): the same tokens /tokenize gives
    for the messages."""
    template = http.get("/tokenizer_info").json()["chat_template"]
    rendered = jinja2.Environment().from_string(template)
    text = rendered.render(messages=MESSAGES, add_generation_prompt=True)
    assert tokenize(http, {"prompt": text, "add_special_tokens": False}) == tokenize(
        http, {"messages": MESSAGES}
    )


def test_fields_they_do_not_know_are_ignored(http: TestClient) -> None:
    """Clients written for vLLM send its other fields; vLLM ignores those it does not know."""
    plain = tokenize(http, {"prompt": "Once upon a time"})
    assert tokenize(http, {"prompt": "Once upon a time", "truncate_prompt_tokens": 4}) == plain
    chat = {"messages": MESSAGES, "continue_final_message": False, "mm_processor_kwargs": {}}
    assert tokenize(http, chat) == tokenize(http, {"messages": MESSAGES})
    decoded = http.post("/detokenize", json={"tokens": plain, "skip_special_tokens": False})
    assert decoded.status_code == 200 and decoded.json() == {"prompt": "<s>Once upon a time"}


def test_mistakes_are_still_refused(http: TestClient) -> None:
    for path, body, param in [
        ("/tokenize", {"prompt": 7}, "prompt"),
        ("/tokenize", {"prompt": "x", "messages": MESSAGES}, None),
        ("/detokenize", {"tokens": ["a"]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ]:
        refused = http.post(path, json=body)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["type"] == "invalid_request_error"
        assert (refused.json()["error"]["param"] or "").split(".")[0] == (param or ""), body


def test_tokenizer_info_is_a_503_while_the_model_loads() -> None:
    response = TestClient(root_app(lambda: None, lambda: "starting")).get("/tokenizer_info")
    assert response.status_code == 503
    assert "loading" in response.json()["error"]["message"]
