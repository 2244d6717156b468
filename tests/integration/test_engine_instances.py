"""TRTLLM_ENGINE_INSTANCES: the CPU engine's tensorrt_llm model runs as several Python stubs behind
one tritonserver, and requests spread over them give the engine's deterministic answers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psutil
from openai import OpenAI

INSTANCES = 3
MAX_TOKENS = 12


def _engine_stubs(server) -> list[psutil.Process]:
    stubs = []
    for process in server.tritons():
        try:
            cmdline = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if "triton_python_backend_stub" in cmdline and "tensorrt_llm/1/model.py" in cmdline:
            stubs.append(process)
    return stubs


def test_engine_instances_serve_requests(bento_server_factory, synthetic_model: str) -> None:
    server = bento_server_factory(
        synthetic_model, {"TRTLLM_ENGINE_INSTANCES": str(INSTANCES), "TRTLLM_ROUTE": "direct"}
    )
    assert len(_engine_stubs(server)) == INSTANCES, server.log()[-3000:]

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id

    def complete(_: int) -> tuple[str, int]:
        completion = client.completions.create(
            model=model, prompt="Once upon a time", max_tokens=MAX_TOKENS, seed=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert completion.usage is not None
        return completion.choices[0].text, completion.usage.completion_tokens

    with ThreadPoolExecutor(max_workers=2 * INSTANCES) as pool:
        answers = list(pool.map(complete, range(4 * INSTANCES)))
    texts = {text for text, _ in answers}
    # The synthetic engine's tokens depend on the prompt only: every instance gives the same text.
    assert len(texts) == 1 and texts.pop()
    assert {tokens for _, tokens in answers} == {MAX_TOKENS}
