"""repository.py: strict filling, all-or-nothing repository writes, localization of paths."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from tensorrtllm_backend.common.model_repository import PATH_PARAMETERS, TemplateError, parse_config
from tensorrtllm_backend.packing.repository import (
    DEFAULTS,
    MODEL_NAMES,
    TEMPLATES_DIR,
    fill_repository,
    fill_template,
    placeholders,
    template_placeholders,
)
from tensorrtllm_backend.triton.localize import localize_repository

TRT = (TEMPLATES_DIR / "tensorrt_llm" / "config.pbtxt").read_text()


def _params(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def _read(repo: Path, model: str) -> model_config_pb2.ModelConfig:
    return parse_config((repo / model / "config.pbtxt").read_text())


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.fixture
def templates(tmp_path: Path) -> Path:
    """A private copy of the shipped templates that a test may break."""
    dst = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, dst)
    return dst


# ------------------------------------------------------------------------- placeholders / defaults


def test_placeholders_finds_braced_and_bare_names() -> None:
    assert placeholders('a: ${one}\nb: "$two" $$notone ${three}x') == {"one", "two", "three"}
    assert placeholders("no placeholders") == set()


def test_every_placeholder_of_every_template_has_a_default() -> None:
    found = template_placeholders()
    assert set(found) == set(MODEL_NAMES)
    for model, names in found.items():
        assert names == set(DEFAULTS[model]), model


# ------------------------------------------------------------------------- fill_template


def test_unknown_key_is_named_with_the_valid_keys() -> None:
    with pytest.raises(TemplateError) as err:
        fill_template(TRT, {"engine_dri": "/e"}, model="tensorrt_llm")
    message = str(err.value)
    assert "engine_dri" in message and "valid keys" in message and "engine_dir" in message


def test_leftover_placeholders_are_named() -> None:
    with pytest.raises(TemplateError, match="left unfilled: .*engine_dir"):
        fill_template(TRT, {"triton_backend": "python"}, model="tensorrt_llm", use_defaults=False)


def test_a_value_that_reintroduces_a_placeholder_is_rejected() -> None:
    with pytest.raises(TemplateError, match="oops"):
        fill_template(TRT, {"engine_dir": "${oops}"}, model="tensorrt_llm")


def test_unknown_model_is_rejected() -> None:
    with pytest.raises(TemplateError, match="unknown model 'gpt'"):
        fill_template(TRT, {}, model="gpt")


def test_empty_string_parameter_means_not_set() -> None:
    filled = fill_template(
        TRT, {"max_tokens_in_paged_kv_cache": "", "engine_dir": "/e"}, model="tensorrt_llm"
    )
    params = _params(parse_config(filled))
    assert params["max_tokens_in_paged_kv_cache"] == ""
    assert params["gpt_model_path"] == "/e"


@pytest.mark.parametrize(
    ("key", "check"),
    [
        ("triton_max_batch_size", lambda c: c.max_batch_size == 64),
        ("decoupled_mode", lambda c: c.model_transaction_policy.decoupled is True),
        ("logits_datatype", lambda c: _dtype(c, "context_logits") == "TYPE_FP32"),
        (
            "encoder_input_features_data_type",
            lambda c: _dtype(c, "encoder_input_features") == "TYPE_FP16",
        ),
        ("max_queue_size", lambda c: c.dynamic_batching.default_queue_policy.max_queue_size == 0),
    ],
)
def test_empty_typed_value_falls_back_to_the_default(key: str, check) -> None:
    config = parse_config(fill_template(TRT, {key: ""}, model="tensorrt_llm"))
    assert check(config)


def _dtype(config: model_config_pb2.ModelConfig, name: str) -> str:
    tensor = next(t for t in [*config.input, *config.output] if t.name == name)
    return model_config_pb2.DataType.Name(tensor.data_type)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("True", True), ("TRUE", True), ("false", False), (True, True), (False, False)],
)
def test_decoupled_mode_accepts_any_case_and_python_bools(value: object, expected: bool) -> None:
    filled = fill_template(TRT, {"decoupled_mode": value}, model="tensorrt_llm")
    assert parse_config(filled).model_transaction_policy.decoupled is expected


@pytest.mark.parametrize(
    ("key", "value", "hint"),
    [
        ("decoupled_mode", "maybe", "true or false"),
        ("triton_max_batch_size", "many", "integer"),
        ("triton_max_batch_size", "-1", "integer"),
        ("logits_datatype", "FP32", "TYPE_FP32"),
        ("logits_datatype", "TYPE_FLOAT", "Triton data type"),
    ],
)
def test_malformed_typed_values_are_rejected(key: str, value: str, hint: str) -> None:
    with pytest.raises(TemplateError) as err:
        fill_template(TRT, {key: value}, model="tensorrt_llm")
    assert key in str(err.value) and hint in str(err.value)


def test_integer_values_are_applied() -> None:
    config = parse_config(fill_template(TRT, {"triton_max_batch_size": 2048}, model="tensorrt_llm"))
    assert config.max_batch_size == 2048
    assert list(config.dynamic_batching.preferred_batch_size) == [2048]


def test_parse_error_names_the_line() -> None:
    with pytest.raises(TemplateError) as err:
        parse_config('name: "x"\nmax_batch_size: 1\ninput [ { name: "a" data_type: TYPE_NOPE } ]\n')
    assert "line 3" in str(err.value) and "TYPE_NOPE" in str(err.value)


def test_a_string_value_breaking_the_quotes_is_caught_by_parsing() -> None:
    filled = fill_template(TRT, {"engine_dir": '/e" x'}, model="tensorrt_llm")
    with pytest.raises(TemplateError, match="line"):
        parse_config(filled)


# ------------------------------------------------------------------------- fill_repository


def test_fill_repository_writes_every_model_filled(tmp_path: Path) -> None:
    options = {
        "triton_backend": "python",
        "engine_dir": "engines",
        "tokenizer_dir": "tokenizer",
        "triton_max_batch_size": "8",
        "decoupled_mode": "True",
        "bls_instance_count": "2",
    }
    repo = fill_repository(tmp_path / "repo", options)
    assert repo == tmp_path / "repo"
    assert sorted(p.name for p in repo.iterdir()) == sorted(MODEL_NAMES)
    for model in MODEL_NAMES:
        text = (repo / model / "config.pbtxt").read_text()
        assert "${" not in text
        config = parse_config(text)
        # prompt_logprobs takes one prompt per request (no batch dimension).
        assert config.name == model
        assert config.max_batch_size == (0 if model == "prompt_logprobs" else 8)
        assert (repo / model / "1").is_dir()
    assert _read(repo, "tensorrt_llm").backend == "python"
    assert _params(_read(repo, "tensorrt_llm"))["gpt_model_path"] == "engines"
    assert _params(_read(repo, "preprocessing"))["gpt_model_path"] == "engines"
    for model in ("preprocessing", "postprocessing", "tensorrt_llm"):
        assert _params(_read(repo, model))["tokenizer_dir"] == "tokenizer"
    assert _read(repo, "tensorrt_llm_bls").instance_group[0].count == 2
    assert _read(repo, "tensorrt_llm_bls").model_transaction_policy.decoupled is True
    assert (repo / "ensemble" / "1" / ".gitkeep").exists()
    assert _leftovers(tmp_path) == []


def test_fill_repository_copies_model_code_but_not_caches(templates: Path, tmp_path: Path) -> None:
    code = templates / "postprocessing" / "1" / "model.py"
    code.write_text("# model\n")
    (templates / "postprocessing" / "1" / "__pycache__").mkdir()
    (templates / "postprocessing" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"x")
    repo = fill_repository(
        tmp_path / "repo", {}, templates_dir=templates, models=["postprocessing"]
    )
    assert (repo / "postprocessing" / "1" / "model.py").read_text() == "# model\n"
    assert not (repo / "postprocessing" / "1" / "__pycache__").exists()
    assert [p.name for p in repo.iterdir()] == ["postprocessing"]


def test_unknown_option_is_rejected_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(TemplateError) as err:
        fill_repository(
            tmp_path / "repo", {"engine_dir": "e", "tokenizer_kind": "auto", "zzz": "1"}
        )
    assert "tokenizer_kind" in str(err.value) and "zzz" in str(err.value)
    assert "valid options" in str(err.value)
    assert not (tmp_path / "repo").exists() and _leftovers(tmp_path) == []


def test_option_used_by_an_unselected_model_only_is_unknown(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="bls_instance_count"):
        fill_repository(tmp_path / "repo", {"bls_instance_count": "1"}, models=["ensemble"])


def test_existing_destination_needs_overwrite(tmp_path: Path) -> None:
    dst = tmp_path / "repo"
    fill_repository(dst, {"triton_max_batch_size": "4"})
    with pytest.raises(TemplateError, match="overwrite"):
        fill_repository(dst, {"triton_max_batch_size": "5"})
    assert _read(dst, "ensemble").max_batch_size == 4
    fill_repository(dst, {"triton_max_batch_size": "5"}, overwrite=True)
    assert _read(dst, "ensemble").max_batch_size == 5
    assert _leftovers(tmp_path) == []


def test_failure_in_the_middle_leaves_no_repository(templates: Path, tmp_path: Path) -> None:
    """ensemble and preprocessing are filled before the broken tensorrt_llm: nothing may remain."""
    broken = templates / "tensorrt_llm" / "config.pbtxt"
    broken.write_text(broken.read_text().replace("dims: [ -1, 3 ]", "dims: [ -1, 3 ", 1))
    dst = tmp_path / "out" / "repo"
    with pytest.raises(TemplateError, match=r"tensorrt_llm/config.pbtxt: line \d+"):
        fill_repository(dst, {"engine_dir": "e"}, templates_dir=templates)
    assert not dst.exists()
    assert _leftovers(dst.parent) == []


def test_failure_with_overwrite_keeps_the_old_repository(templates: Path, tmp_path: Path) -> None:
    dst = tmp_path / "repo"
    fill_repository(dst, {"triton_max_batch_size": "4"})
    broken = templates / "postprocessing" / "config.pbtxt"
    broken.write_text(broken.read_text().replace('name: "postprocessing"', 'name: "post"'))
    with pytest.raises(TemplateError, match="must match|match the folder"):
        fill_repository(
            dst, {"triton_max_batch_size": "9"}, templates_dir=templates, overwrite=True
        )
    assert _read(dst, "ensemble").max_batch_size == 4
    assert _leftovers(tmp_path) == []


def test_missing_template_is_reported(templates: Path, tmp_path: Path) -> None:
    shutil.rmtree(templates / "tensorrt_llm_bls")
    with pytest.raises(TemplateError, match="tensorrt_llm_bls"):
        fill_repository(tmp_path / "repo", {}, templates_dir=templates)


# ------------------------------------------------------------------------- localize_repository


def test_localize_rewrites_relative_paths_only(tmp_path: Path) -> None:
    options = {
        "triton_backend": "python",
        "engine_dir": "engines",
        "tokenizer_dir": "./tokenizer",
        "multimodal_model_path": "/abs/vision",
        "lora_prefetch_dir": "",
        "batch_scheduler_policy": "max_utilization",
    }
    stored = fill_repository(tmp_path / "stored", options)
    model_root = tmp_path / "models" / "m1"
    out = localize_repository(stored, tmp_path / "run" / "repo", model_root)

    tensorrt = _params(_read(out, "tensorrt_llm"))
    pre = _params(_read(out, "preprocessing"))
    post = _params(_read(out, "postprocessing"))
    assert tensorrt["gpt_model_path"] == str(model_root / "engines")
    assert pre["gpt_model_path"] == str(model_root / "engines")
    for params in (tensorrt, pre, post):
        assert params["tokenizer_dir"] == str(model_root / "tokenizer")
    assert pre["multimodal_model_path"] == "/abs/vision"
    assert tensorrt["lora_prefetch_dir"] == "" and tensorrt["encoder_model_path"] == ""
    assert tensorrt["batch_scheduler_policy"] == "max_utilization"
    assert pre["tokenizer_type"] == "auto"
    assert (
        tensorrt["executor_worker_path"]
        == "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
    )
    # Everything else survives the protobuf round trip; the stored copy is untouched.
    for model in MODEL_NAMES:
        before, after = _read(stored, model), _read(out, model)
        for key in PATH_PARAMETERS & set(before.parameters):
            before.parameters[key].string_value = after.parameters[key].string_value
        assert before == after, model
    assert _params(_read(stored, "tensorrt_llm"))["gpt_model_path"] == "engines"
    assert (out / "ensemble" / "1").is_dir()
    assert _leftovers(tmp_path / "run") == []


def test_localize_resolves_against_a_relative_model_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = fill_repository(tmp_path / "stored", {"engine_dir": "engines"})
    monkeypatch.chdir(tmp_path)
    out = localize_repository(stored, tmp_path / "run", Path("models/m1"))
    assert _params(_read(out, "tensorrt_llm"))["gpt_model_path"] == str(
        tmp_path / "models" / "m1" / "engines"
    )


def test_localize_refuses_an_existing_destination_unless_asked(tmp_path: Path) -> None:
    stored = fill_repository(tmp_path / "stored", {"engine_dir": "e1"})
    out = localize_repository(stored, tmp_path / "run", tmp_path / "a")
    with pytest.raises(TemplateError, match="overwrite"):
        localize_repository(stored, out, tmp_path / "b")
    localize_repository(stored, out, tmp_path / "b", overwrite=True)
    assert _params(_read(out, "tensorrt_llm"))["gpt_model_path"] == str(tmp_path / "b" / "e1")


def test_localize_rejects_a_missing_source(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="not a model repository"):
        localize_repository(tmp_path / "nope", tmp_path / "run", tmp_path)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("backend", "expected"), [("python", 6), ("tensorrtllm", 1)])
def test_engine_instances_apply_to_the_cpu_stand_in_only(
    tmp_path: Path, backend: str, expected: int
) -> None:
    stored = fill_repository(tmp_path / "stored", {"triton_backend": backend})
    out = localize_repository(stored, tmp_path / "run", tmp_path / "m", engine_instances=6)
    groups = _read(out, "tensorrt_llm").instance_group
    assert [(g.count, g.kind) for g in groups] == [
        (expected, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    ]
    assert _read(out, "preprocessing").instance_group[0].count == 1


def test_engine_instances_below_one_are_rejected(tmp_path: Path) -> None:
    stored = fill_repository(tmp_path / "stored", {"triton_backend": "python"})
    with pytest.raises(TemplateError, match="1 or more"):
        localize_repository(stored, tmp_path / "run", tmp_path / "m", engine_instances=0)
    assert not (tmp_path / "run").exists()
