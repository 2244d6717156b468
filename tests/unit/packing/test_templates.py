"""Conformance of the shipped templates with NVIDIA's inflight_batcher_llm at main c2e65b8.

The expected tensors, wiring and placeholders are transcribed from the contract doc into
tests/data/contract_c2e65b8.json; every mismatch is listed in the assertion message.
"""

from __future__ import annotations

import json
from pathlib import Path
from string import Template

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tensorrtllm_backend.common.model_repository import parse_config
from tensorrtllm_backend.packing.repository import (
    DEFAULTS,
    NVIDIA_MODEL_NAMES,
    TEMPLATES_DIR,
    TYPED_PLACEHOLDERS,
    fill_template,
    placeholders,
)

CONTRACT = json.loads((Path(__file__).parents[2] / "data" / "contract_c2e65b8.json").read_text())
# Tensors of ours beyond NVIDIA's, named in the template's header: optional inputs (a request
# written for NVIDIA's model never needs them) and outputs sent only when asked for.
OUR_EXTRAS = {
    ("tensorrt_llm", "inputs", "top_log_probs"),
    ("tensorrt_llm", "inputs", "images"),
    ("tensorrt_llm", "outputs", "output_top_token_ids"),
    ("tensorrt_llm", "outputs", "output_top_log_probs"),
}
# Distinct values for the typed placeholders prove those tensors really are placeholder-typed.
SENTINELS = {"logits_datatype": "TYPE_BF16", "encoder_input_features_data_type": "TYPE_FP64"}


def _template(model: str) -> str:
    return (TEMPLATES_DIR / model / "config.pbtxt").read_text()


def _filled(model: str) -> model_config_pb2.ModelConfig:
    text = _template(model)
    values = {k: v for k, v in SENTINELS.items() if k in placeholders(text)}
    return parse_config(fill_template(text, values, model=model))


def _raw_parameters(model: str) -> dict[str, str]:
    """Parameters with string placeholders left as written (only typed ones are substituted)."""
    text = _template(model)
    typed = {k: DEFAULTS[model][k] for k in TYPED_PLACEHOLDERS if k in placeholders(text)}
    config = text_format.Parse(
        Template(text).safe_substitute(typed), model_config_pb2.ModelConfig()
    )
    return {k: v.string_value for k, v in config.parameters.items()}


def _dtype_name(value: int) -> str:
    return model_config_pb2.DataType.Name(value)


def _describe(tensor) -> dict:
    desc = {
        "data_type": _dtype_name(tensor.data_type),
        "dims": list(tensor.dims),
        "reshape": list(tensor.reshape.shape) if tensor.HasField("reshape") else None,
    }
    if hasattr(tensor, "optional"):
        desc["optional"] = tensor.optional
        desc["allow_ragged_batch"] = tensor.allow_ragged_batch
    return desc


def _expected(spec: dict) -> dict:
    dtype = spec["data_type"]
    if dtype.startswith("${"):
        dtype = SENTINELS[dtype[2:-1]]
    return {
        "data_type": dtype,
        "dims": spec["dims"],
        "reshape": spec["reshape"],
        "optional": spec["optional"],
        "allow_ragged_batch": spec["allow_ragged_batch"],
    }


def _tensor_mismatches(model: str) -> tuple[int, list[str]]:
    """(matching tensors, problems) for one model against the contract."""
    config = _filled(model)
    spec = CONTRACT["models"][model]
    problems: list[str] = []
    matched = 0
    for direction, actual_list in (("inputs", config.input), ("outputs", config.output)):
        actual = {}
        for tensor in actual_list:
            if tensor.name in actual:
                problems.append(f"{model} {direction} {tensor.name}: listed twice")
            actual[tensor.name] = _describe(tensor)
        expected_names = {t["name"] for t in spec[direction]}
        for extra in sorted(set(actual) - expected_names):
            if (model, direction, extra) not in OUR_EXTRAS:
                problems.append(f"{model} {direction} {extra}: not in the contract")
            elif direction == "inputs" and not actual[extra]["optional"]:
                problems.append(f"{model} inputs {extra}: ours, but not optional")
        for expected in spec[direction]:
            name = expected["name"]
            if name not in actual:
                problems.append(f"{model} {direction} {name}: missing")
                continue
            want = _expected(expected)
            if direction == "outputs":  # outputs have no optional/ragged flags in ModelOutput
                want = {k: v for k, v in want.items() if k in actual[name]}
                if expected["optional"] or expected["allow_ragged_batch"]:
                    problems.append(f"{model} outputs {name}: contract flags an output")
            diffs = [
                f"{key} {actual[name].get(key)!r} != {value!r}"
                for key, value in want.items()
                if actual[name].get(key) != value
            ]
            if diffs:
                problems.append(f"{model} {direction} {name}: " + "; ".join(diffs))
            else:
                matched += 1
    return matched, problems


def test_contract_transcription_has_the_documented_totals() -> None:
    tensors = sum(len(m["inputs"]) + len(m["outputs"]) for m in CONTRACT["models"].values())
    assert tensors == CONTRACT["expected_counts"]["tensors"] == 223
    assert len(CONTRACT["ensemble_wiring"]) == CONTRACT["expected_counts"]["wiring"] == 77
    assert set(CONTRACT["models"]) == set(NVIDIA_MODEL_NAMES)


def test_every_tensor_matches_the_contract() -> None:
    matched, problems = 0, []
    for model in NVIDIA_MODEL_NAMES:
        model_matched, model_problems = _tensor_mismatches(model)
        matched += model_matched
        problems += model_problems
    total = CONTRACT["expected_counts"]["tensors"]
    assert not problems, f"{matched}/{total} tensors conform; mismatches:\n" + "\n".join(problems)
    assert matched == total


def test_our_extras_are_named_in_the_template_header() -> None:
    for model, _direction, name in OUR_EXTRAS:
        header = _template(model).split("\nname:", 1)[0]
        assert name in header, f"{model}: {name} is not documented in the header"


@pytest.mark.parametrize("model", NVIDIA_MODEL_NAMES)
def test_platform_backend_and_name(model: str) -> None:
    spec = CONTRACT["models"][model]
    text = _template(model)
    config = parse_config(fill_template(text, {}, model=model))
    assert config.name == model
    if "platform" in spec:
        assert (config.platform, config.backend) == (spec["platform"], "")
    else:
        assert f'backend: "{spec["backend"]}"' in text
    assert config.max_batch_size == int(DEFAULTS[model]["triton_max_batch_size"])
    assert "max_batch_size: ${triton_max_batch_size}" in text


@pytest.mark.parametrize("model", NVIDIA_MODEL_NAMES)
def test_decoupled_policy_only_where_nvidia_has_it(model: str) -> None:
    expected = CONTRACT["models"][model]["decoupled"]
    text = _template(model)
    if expected is None:
        assert "model_transaction_policy" not in text
        assert not _filled(model).HasField("model_transaction_policy")
        return
    assert "decoupled: ${decoupled_mode}" in text
    for value, parsed in (("true", True), ("True", True), ("False", False)):
        config = parse_config(fill_template(text, {"decoupled_mode": value}, model=model))
        assert config.model_transaction_policy.decoupled is parsed


def test_ensemble_wiring_matches_the_contract() -> None:
    config = _filled("ensemble")
    steps = config.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["preprocessing", "tensorrt_llm", "postprocessing"]
    actual = set()
    for step in steps:
        assert step.model_version == -1
        actual |= {(step.model_name, "input", k, v) for k, v in step.input_map.items()}
        actual |= {(step.model_name, "output", k, v) for k, v in step.output_map.items()}
    expected = {(w["step"], w["map"], w["key"], w["value"]) for w in CONTRACT["ensemble_wiring"]}
    missing, extra = sorted(expected - actual), sorted(actual - expected)
    assert not missing and not extra, f"missing wiring: {missing}\nextra wiring: {extra}"


def test_ensemble_consumes_every_input_and_feeds_every_output() -> None:
    """Triton rejects an ensemble with an unused input or an unmapped output."""
    config = _filled("ensemble")
    consumed = {v for s in config.ensemble_scheduling.step for v in s.input_map.values()}
    produced = {v for s in config.ensemble_scheduling.step for v in s.output_map.values()}
    assert {t.name for t in config.input} <= consumed
    assert {t.name for t in config.output} <= produced


def test_ensemble_step_tensors_exist_in_the_step_models() -> None:
    """Every mapped key is a real input/output of the model the step calls, with matching dtype."""
    config = _filled("ensemble")
    client = {t.name: t.data_type for t in [*config.input, *config.output]}
    internal: dict[str, int] = {}
    problems = []
    for step in config.ensemble_scheduling.step:
        model = _filled(step.model_name)
        inputs = {t.name: t.data_type for t in model.input}
        outputs = {t.name: t.data_type for t in model.output}
        for key, value in step.output_map.items():
            if key not in outputs:
                problems.append(f"{step.model_name} has no output {key}")
                continue
            internal[value] = outputs[key]
            if value in client and client[value] != outputs[key]:
                problems.append(f"{value}: ensemble dtype differs from {step.model_name}.{key}")
        for key, value in step.input_map.items():
            source = internal.get(value, client.get(value))
            if key not in inputs:
                problems.append(f"{step.model_name} has no input {key}")
            elif source != inputs[key]:
                problems.append(f"{step.model_name}.{key} dtype differs from its source {value}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("model", NVIDIA_MODEL_NAMES)
def test_templates_contain_every_placeholder_the_standard_commands_pass(model: str) -> None:
    missing = set(CONTRACT["must_contain_placeholders"][model]) - placeholders(_template(model))
    assert not missing, f"{model} lacks placeholders {sorted(missing)}"


@pytest.mark.parametrize("model", NVIDIA_MODEL_NAMES)
def test_parameters_match_nvidia(model: str) -> None:
    actual = _raw_parameters(model)
    expected = CONTRACT["parameters"][model]
    wrong = {k: (actual.get(k), v) for k, v in expected.items() if actual.get(k) != v}
    assert not wrong, f"{model} parameters (ours, NVIDIA's): {wrong}"


def test_tokenizer_type_is_kept_for_v080_commands() -> None:
    for model in ("preprocessing", "postprocessing"):
        assert _raw_parameters(model)["tokenizer_type"] == "${tokenizer_type}"


def test_tensorrt_llm_for_the_cpp_backend() -> None:
    """Filled for NVIDIA's C++ backend, the config names it and keeps its fixed parameters."""
    text = _template("tensorrt_llm")
    config = parse_config(
        fill_template(
            text, {"triton_backend": "tensorrtllm", "engine_dir": "/e"}, model="tensorrt_llm"
        )
    )
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert config.backend == "tensorrtllm"
    assert params["gpt_model_path"] == "/e"
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["FORCE_CPU_ONLY_INPUT_TENSORS"] == "no"
    assert [(g.count, g.kind) for g in config.instance_group] == [
        (1, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    ]
    assert "enable_trt_overlap" not in params  # only in a comment, as in NVIDIA's file
    python = parse_config(fill_template(text, {"triton_backend": "python"}, model="tensorrt_llm"))
    assert python.backend == "python"


@pytest.mark.parametrize("model", ["tensorrt_llm", "preprocessing"])
def test_dynamic_batching_follows_the_batch_size(model: str) -> None:
    text = _template(model)
    values = {
        "triton_max_batch_size": "2048",
        "max_queue_delay_microseconds": "100",
        "max_queue_size": "7",
    }
    config = parse_config(fill_template(text, values, model=model))
    batching = config.dynamic_batching
    assert list(batching.preferred_batch_size) == [2048]
    assert batching.max_queue_delay_microseconds == 100
    assert batching.default_queue_policy.max_queue_size == 7


@pytest.mark.parametrize("model", NVIDIA_MODEL_NAMES)
def test_headers_note_the_v080_differences(model: str) -> None:
    header = _template(model).split("\nname:", 1)[0]
    assert "c2e65b8" in header and "v0.8.0" in header
