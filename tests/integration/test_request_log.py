"""One structured log line per request, with its id and figures, never the prompt or output."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.integration.conftest import BentoServer

pytestmark = pytest.mark.integration


def test_request_log_line_has_figures_and_no_text(demo_server: BentoServer) -> None:
    secret = "zebra-quartz-7731"
    response = httpx.post(
        f"{demo_server.url}/generate_text",
        json={"prompt": f"my secret is {secret}", "max_tokens": 5},
        timeout=60,
    )
    assert response.status_code == 200
    pattern = re.compile(
        r"request_id=[0-9a-f]{24} api=native finish=length prompt_tokens=\d+ "
        r"completion_tokens=5 ttft_ms=[\d.]+ duration_ms=[\d.]+"
    )
    deadline = time.monotonic() + 10
    while not pattern.search(demo_server.log()) and time.monotonic() < deadline:
        time.sleep(0.2)
    log = demo_server.log()
    assert pattern.search(log), log[-2000:]
    assert secret not in log
    assert response.json()["text"] not in log or len(response.json()["text"]) < 4
