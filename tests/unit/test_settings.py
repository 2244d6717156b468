"""The settings module: its rule for values, its errors, and docs/configuration.md's table."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tensorrtllm_backend.python_models import stub_settings
from tensorrtllm_backend.serving.chat.core import check_parser_names
from tensorrtllm_backend.serving.chat.reasoning import REASONING_FORMATS
from tensorrtllm_backend.serving.chat.tool_parsers import FORMATS
from tensorrtllm_backend.settings import (
    BACKEND_PYTHONPATH_ENV,
    PREFIX,
    STUB_VARIABLES,
    Settings,
    env_name,
    host_workers,
    load_settings,
)

CONFIGURATION = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _documented_variables() -> set[str]:
    """The variables named in the rows of docs/configuration.md's table."""
    rows = [line for line in CONFIGURATION.read_text().splitlines() if line.startswith("|")]
    return set(re.findall(r"`(TRTLLM_[A-Z0-9_]+)`", "\n".join(rows)))


def test_the_configuration_page_documents_every_variable_and_no_other() -> None:
    known = {env_name(field) for field in Settings.model_fields} | set(STUB_VARIABLES)
    assert _documented_variables() == known


def test_the_stubs_read_what_the_settings_list() -> None:
    read_in_stubs = {
        value
        for name, value in vars(stub_settings).items()
        if name.endswith("_ENV") and isinstance(value, str)
    }
    assert read_in_stubs | {BACKEND_PYTHONPATH_ENV} == set(STUB_VARIABLES)


def test_the_parser_names_are_the_registries_names() -> None:
    for name in [*FORMATS, "none", None]:
        check_parser_names(name, None)
    for name in [*REASONING_FORMATS, "none", None]:
        check_parser_names(None, name)
    with pytest.raises(ValueError, match="TRTLLM_TOOL_PARSER='pythonic'.*hermes.*none"):
        check_parser_names("pythonic", None)
    with pytest.raises(ValueError, match="TRTLLM_REASONING_PARSER='r2'.*qwen3"):
        check_parser_names(None, "r2")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("off", False)],
)
def test_one_rule_for_booleans(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    for name in ("LOG_REQUESTS", "TRACE_STREAMS", "EXPORT_TRITON_METRICS"):
        monkeypatch.setenv(PREFIX + name, value)
    settings = load_settings()
    assert settings.log_requests is settings.trace_streams is settings.export_triton_metrics
    assert settings.log_requests is expected


def test_an_empty_value_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_API_KEY", "")
    monkeypatch.setenv("TRTLLM_WORKERS", "")
    settings = load_settings()
    assert settings.api_key is None
    assert settings.workers == host_workers()  # the default, whatever this host's cores


# variable: (value, what pydantic says of it)
BAD_VALUES = {
    "TRTLLM_LOG_REQUESTS": ("sometimes", "valid boolean"),
    "TRTLLM_WORKERS": ("0", "greater than 0"),
    "TRTLLM_TRITON_GRPC_PORT": ("70000", "less than or equal to 65535"),
    "TRTLLM_ROUTE": ("fast", "'direct', 'ensemble', 'bls' or 'llmapi'"),
}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_a_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    value, message = BAD_VALUES[name]
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r}")) as raised:
        load_settings()
    assert message in str(raised.value)


def test_the_api_key_is_not_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_API_KEY", "s3cret")
    settings = load_settings()
    assert "s3cret" not in repr(settings)
    assert settings.api_key is not None and settings.api_key.get_secret_value() == "s3cret"


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 1), (7, 1), (8, 2), (16, 4), (64, 8)])
def test_the_default_workers_follow_the_cores(
    monkeypatch: pytest.MonkeyPatch, cores: int, workers: int
) -> None:
    """A worker per 4 cores this process may run on, 1 to 8 (docs/configuration.md)."""
    monkeypatch.delenv("TRTLLM_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert load_settings().workers == workers
    monkeypatch.setenv("TRTLLM_WORKERS", "3")
    assert load_settings().workers == 3
