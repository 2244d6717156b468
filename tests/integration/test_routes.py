"""The ensemble and BLS routes through the real service: the same request path as `direct`, text in
and text out through NVIDIA's client-facing tensors."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import httpx
import pytest

from tests.integration.conftest import BentoServer

pytestmark = pytest.mark.integration

PROMPT = "The quick brown fox jumps over the lazy dog"


def stream_text(url: str, body: dict[str, object]) -> str:
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        return "".join(response.iter_text())


@pytest.mark.parametrize("route", ["ensemble", "bls"])
def test_text_routes_behave_like_direct(
    route: str, demo_server: BentoServer, text_route: Callable[[str], BentoServer]
) -> None:
    direct, routed_server = demo_server, text_route(route)
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0}

    expected = httpx.post(f"{direct.url}/generate_text", json=body, timeout=60).json()["text"]
    whole = httpx.post(f"{routed_server.url}/generate_text", json=body, timeout=60).json()
    streamed = stream_text(routed_server.url, body)
    # Greedy decoding of the same engine: the text is the route's business, not the engine's.
    assert whole["text"] == streamed == expected
    assert whole["usage"]["prompt_tokens"] > 0 and whole["usage"]["completion_tokens"] > 0

    stop = expected.strip().split()[len(expected.split()) // 2]
    cut = httpx.post(
        f"{routed_server.url}/generate_text", json={**body, "stop": [stop]}, timeout=60
    ).json()
    # cut right before the stop string's first occurrence, as on the direct route
    assert cut["text"] == expected[: expected.index(stop)]
    assert cut["finish_reason"] == "stop"

    completion = httpx.post(
        f"{routed_server.url}/v1/completions",
        json={"model": "trtllm-demo", "prompt": PROMPT, "max_tokens": 24, "temperature": 0},
        timeout=60,
    )
    assert completion.status_code == 200, completion.text
    assert json.loads(completion.text)["choices"][0]["text"] == expected

    # Alternatives to the chosen tokens come back on the token-id routes only.
    ranked = {**body, "return_log_probs": True, "top_log_probs": 2}
    refused = httpx.post(f"{routed_server.url}/generate_text", json=ranked, timeout=60)
    assert refused.status_code == 400 and "direct route" in refused.text

    # Several sequences: the BLS demultiplexes them by sequence_index; the ensemble cannot (its
    # postprocessing never sees sequence_index), so the service refuses instead of mixing texts.
    sampled = {**body, "temperature": 0.8, "top_k": 50, "seed": 3, "ignore_eos": True}
    several = {**sampled, "num_return_sequences": 2}
    if route == "bls":
        want = httpx.post(f"{direct.url}/generate_text", json=several, timeout=60).json()
        got = httpx.post(f"{routed_server.url}/generate_text", json=several, timeout=60).json()
        assert [s["text"] for s in got["sequences"]] == [s["text"] for s in want["sequences"]]
        assert got["sequences"][0]["text"] != got["sequences"][1]["text"]
    else:
        refused = httpx.post(f"{routed_server.url}/generate_text", json=several, timeout=60)
        assert refused.status_code == 400 and "sequence_index" in refused.text


def test_concurrent_stop_strings_keep_tritonserver_up(
    text_route: Callable[[str], BentoServer],
) -> None:
    """Cutting a stream at a stop string used to cancel it just as the engine, which had the same
    stop words, ended it: under concurrency that race crashed tritonserver 2.51 within seconds
    (server#7840). The cut streams are now left to end."""
    server = text_route("ensemble")
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    expected = httpx.post(f"{server.url}/generate_text", json=body, timeout=60).json()["text"]
    stop = expected.strip().split()[len(expected.split()) // 2]
    (triton,) = [p for p in server.tritons() if "tritonserver" in p.cmdline()[0]]
    statuses: list[int] = []

    def cut_repeatedly() -> None:
        with httpx.Client(timeout=60) as client:
            for _ in range(60):
                response = client.post(f"{server.url}/generate_text", json={**body, "stop": [stop]})
                statuses.append(response.status_code)

    threads = [threading.Thread(target=cut_repeatedly) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert statuses.count(200) == len(statuses) == 240, sorted(set(statuses))
    assert triton.is_running(), "tritonserver died (and was restarted)"
