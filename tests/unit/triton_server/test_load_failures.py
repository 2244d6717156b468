"""Reading model-load failures out of a Triton log (load_failures), on lines as Triton 2.51
writes them, and telling the ones a restart cannot fix from the ones it may."""

from __future__ import annotations

from pathlib import Path

from tensorrtllm_backend.triton.load_failures import (
    deterministic_failures,
    parse_load_failures,
    read_load_failures,
)

IMPORT_ERROR = (
    "E1124 20:34:57.002579 7770 model_lifecycle.cc:642] \"failed to load 'probe' version 1: "
    "Internal: ImportError: /x/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so: undefined "
    'symbol: _PyModule_Add\\n\\nAt:\\n  /x/ssl.py(100): <module>\\n"'
)
BAD_CONFIG = (
    'E1124 20:40:01.000000 1 model_repository_manager.cc:1460] "Poll failed for model '
    "directory 'echo': failed to read text proto from /r/echo/config.pbtxt\""
)
OOM = (
    "E1124 20:41:00.000000 1 model_lifecycle.cc:642] \"failed to load 'tensorrt_llm' version "
    '1: Internal: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"'
)


def test_an_import_error_is_read_without_its_traceback() -> None:
    (failure,) = parse_load_failures(f"I1124 starting\n{IMPORT_ERROR}\nI1124 failed\n")
    assert failure.model == "probe"
    assert failure.reason.startswith("Internal: ImportError: ")
    assert "undefined symbol: _PyModule_Add" in failure.reason
    assert "At:" not in failure.reason and not failure.reason.endswith('"')
    assert failure.deterministic
    assert str(failure).startswith("model 'probe' failed to load: Internal: ImportError")


def test_a_config_that_does_not_parse_is_deterministic() -> None:
    (failure,) = parse_load_failures(BAD_CONFIG)
    assert failure.model == "echo" and "config.pbtxt" in failure.reason
    assert deterministic_failures([failure]) == [failure]


def test_out_of_memory_is_worth_another_start() -> None:
    failures = parse_load_failures(f"{IMPORT_ERROR}\n{OOM}\n")
    assert [f.model for f in failures] == ["probe", "tensorrt_llm"]
    assert not failures[1].deterministic
    assert deterministic_failures(failures) == []


def test_a_log_without_failures_has_none(tmp_path: Path) -> None:
    assert parse_load_failures("I1124 successfully loaded 'echo'\n") == []
    assert deterministic_failures([]) == []
    assert read_load_failures(tmp_path / "missing.log") == []
    log = tmp_path / "triton.log"
    log.write_text(f"{BAD_CONFIG}\n")
    assert [f.model for f in read_load_failures(log)] == ["echo"]
