"""Prometheus metrics on BentoML's /metrics: after native and OpenAI requests against a
real `bentoml serve` of the demo model, every generation metric moved by exactly what was served."""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from conftest import BentoServer  # tests/integration/conftest.py

pytestmark = pytest.mark.integration

PROMPT = "Once upon a time"
MODEL = "trtllm-demo"
TIMEOUT = 60.0


def scrape(server: BentoServer) -> Counter[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every sample of the trtllm_* families, keyed by (sample name, sorted labels)."""
    text = httpx.get(f"{server.url}/metrics", timeout=TIMEOUT).text
    samples: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("trtllm_"):
            continue
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
            if "le" in sample.labels:
                continue  # buckets: counts and sums are enough here
            samples[(sample.name, labels)] += sample.value
    return samples


def delta(before: Counter, after: Counter, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after[key] - before[key]


def total(samples: Counter, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


LONG_STREAM = 500  # tokens: the test model takes 512 with the prompt
NATIVE = (("api", "native"),)


def watched_stream(server: BentoServer) -> list[float]:
    """A LONG_STREAM-token /generate stream, and the in-flight gauge's readings while it ran."""
    in_flight: list[float] = []
    streaming = threading.Event()

    def watch() -> None:
        while streaming.is_set():
            in_flight.append(scrape(server)[("trtllm_requests_in_flight", NATIVE)])

    with httpx.stream(
        "POST", f"{server.url}/generate", timeout=TIMEOUT,
        json={"prompt": PROMPT, "max_tokens": LONG_STREAM, "ignore_eos": True},
    ) as response:  # fmt: skip
        streaming.set()
        watcher = threading.Thread(target=watch)
        watcher.start()
        chunks = list(response.iter_text())
        streaming.clear()
        watcher.join(TIMEOUT)
    assert response.status_code == 200 and chunks
    return in_flight


def test_generation_metrics_move_by_what_was_served(demo_server: BentoServer) -> None:
    url = demo_server.url
    before = scrape(demo_server)
    native_prompt = 0
    native_tokens = 0
    for max_tokens in (3, 5, 8):
        result = httpx.post(
            f"{url}/generate_text", timeout=TIMEOUT,
            json={"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True},
        ).json()  # fmt: skip
        assert result["usage"]["completion_tokens"] == max_tokens
        native_prompt += result["usage"]["prompt_tokens"]
        native_tokens += max_tokens
    # The gauge is read over and over while a long stream runs: on a fast machine its whole
    # generation can end before a single read after its first chunk, and on a loaded one a read
    # can take as long as the stream. A stream that was never seen in flight is run again (each
    # is counted below), up to five.
    in_flight: list[float] = []
    streams = 0
    while max(in_flight, default=0) < 1 and streams < 5:
        in_flight = watched_stream(demo_server)
        streams += 1
        native_prompt += result["usage"]["prompt_tokens"]
        native_tokens += LONG_STREAM

    completion = httpx.post(
        f"{url}/v1/completions", timeout=TIMEOUT,
        json={"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "ignore_eos": True},
    ).json()  # fmt: skip
    chat_lines = []
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", timeout=TIMEOUT,
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
              "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}},
    ) as response:  # fmt: skip
        chat_lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    chat_usage: dict[str, Any] = json.loads(chat_lines[-1][6:])["usage"]
    after = scrape(demo_server)

    assert max(in_flight, default=0) >= 1, in_flight  # the stream was seen in flight
    for api in ("native", "openai_completions", "openai_chat"):
        assert after[("trtllm_requests_in_flight", (("api", api),))] == 0

    served = {
        "native": (3 + streams, native_prompt, native_tokens),
        "openai_completions": (1, completion["usage"]["prompt_tokens"], 4),
        "openai_chat": (1, chat_usage["prompt_tokens"], 6),
    }
    for api, (requests, prompt_tokens, tokens) in served.items():
        assert delta(before, after, "trtllm_prompt_tokens_total", api=api) == prompt_tokens, api
        assert delta(before, after, "trtllm_completion_tokens_total", api=api) == tokens, api
        assert delta(before, after, "trtllm_requests_total", api=api,
                     finish_reason="length") == requests, api  # fmt: skip
        for histogram in ("time_to_first_token", "request_duration"):
            name = f"trtllm_{histogram}_seconds_count"
            assert delta(before, after, name, api=api) == requests, (api, histogram)
            assert delta(before, after, f"trtllm_{histogram}_seconds_sum", api=api) > 0
        # one inter-token latency per token after each request's first
        assert (
            delta(before, after, "trtllm_inter_token_latency_seconds_count", api=api)
            == tokens - requests
        ), api
    errors = total(after, "trtllm_request_errors_total") - total(
        before, "trtllm_request_errors_total"
    )
    assert errors == 0


def test_rejected_requests_are_counted_as_errors(demo_server: BentoServer) -> None:
    """Errors by kind: a request rejected as invalid is an error of the API that got it."""
    before = scrape(demo_server)
    bad_native = httpx.post(
        f"{demo_server.url}/generate_text", json={"prompt": "hi", "max_tokens": 100000},
        timeout=TIMEOUT,
    )  # fmt: skip
    bad_openai = httpx.post(
        f"{demo_server.url}/v1/completions",
        json={"model": MODEL, "prompt": "hi", "max_tokens": 100000}, timeout=TIMEOUT,
    )  # fmt: skip
    assert bad_native.status_code == bad_openai.status_code == 400
    after = scrape(demo_server)
    assert (
        total(after, "trtllm_request_errors_total") - total(before, "trtllm_request_errors_total")
        == 2
    ), "rejected requests are not counted in trtllm_request_errors_total"
