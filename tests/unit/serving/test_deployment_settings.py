"""Deployment settings read from the environment: BentoML's traffic (concurrency, external queue)
and the CPU stand-in's engine instances."""

from __future__ import annotations

import pytest

from tensorrtllm_backend.serving.deployment import REQUEST_TIMEOUT_S, traffic
from tensorrtllm_backend.settings import load_settings

ABSENT = "no-such-model:latest"  # not in the store: no engine metadata to size from


def test_concurrency_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_CONCURRENCY", "96")
    monkeypatch.delenv("TRTLLM_EXTERNAL_QUEUE", raising=False)
    assert traffic(ABSENT) == {"timeout": REQUEST_TIMEOUT_S, "concurrency": 96}


def test_external_queue_is_set_with_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_CONCURRENCY", "64")
    monkeypatch.setenv("TRTLLM_EXTERNAL_QUEUE", "1")
    assert traffic(ABSENT)["external_queue"] is True


def test_unset_concurrency_without_a_stored_engine_leaves_it_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRTLLM_CONCURRENCY", raising=False)
    monkeypatch.delenv("TRTLLM_EXTERNAL_QUEUE", raising=False)
    assert "concurrency" not in traffic(ABSENT)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRTLLM_CONCURRENCY": "0"}, "TRTLLM_CONCURRENCY='0'"),
        ({"TRTLLM_CONCURRENCY": "many"}, "valid integer"),
        ({"TRTLLM_CONCURRENCY": "8", "TRTLLM_EXTERNAL_QUEUE": "maybe"}, "valid boolean"),
        ({"TRTLLM_EXTERNAL_QUEUE": "1"}, "needs TRTLLM_CONCURRENCY"),
    ],
)
def test_bad_traffic_settings_say_what_to_fix(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    monkeypatch.delenv("TRTLLM_CONCURRENCY", raising=False)
    monkeypatch.delenv("TRTLLM_EXTERNAL_QUEUE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        traffic(ABSENT)


def test_engine_instances_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRTLLM_ENGINE_INSTANCES", raising=False)
    assert load_settings().engine_instances is None
    monkeypatch.setenv("TRTLLM_ENGINE_INSTANCES", "8")
    assert load_settings().engine_instances == 8
    monkeypatch.setenv("TRTLLM_ENGINE_INSTANCES", "-2")
    with pytest.raises(ValueError, match="TRTLLM_ENGINE_INSTANCES"):
        load_settings()
