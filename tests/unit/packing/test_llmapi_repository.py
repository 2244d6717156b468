"""The llmapi repository template against NVIDIA's llmapi model (tests/data/contract_llmapi.json),
the model.yaml pack_model writes, and its localization on the serving machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tritonclient.grpc import model_config_pb2

from tensorrtllm_backend.common.model_repository import TemplateError, parse_config
from tensorrtllm_backend.packing.llmapi_repository import (
    MODEL_NAME,
    TEMPLATES_DIR,
    build_model_yaml,
    parse_llm_args,
    write_llmapi_repository,
)
from tensorrtllm_backend.python_models.llmapi_choice import configured_model
from tensorrtllm_backend.triton.localize import localize_model_yaml

CONTRACT = json.loads((Path(__file__).parents[2] / "data" / "contract_llmapi.json").read_text())
CONFIG = TEMPLATES_DIR / MODEL_NAME / "config.pbtxt"
TEMPLATE_YAML = TEMPLATES_DIR / MODEL_NAME / "1" / "model.yaml"


def _dtype(name: str) -> str:
    return "TYPE_" + name


def _differences(kind: str, ours: list, expected: list[dict], with_optional: bool) -> list[str]:
    """How our tensors fail to be a superset of NVIDIA's: each of theirs present with the same
    dtype, dims and optional flag; each of ours beyond them optional (inputs), so that a request
    written for NVIDIA's model needs none of them."""
    got = {tensor.name: tensor for tensor in ours}
    want = {row["name"]: row for row in expected}
    problems = [f"{kind} {name}: missing" for name in want if name not in got]
    problems += [
        f"{kind} {name}: ours, but not optional"
        for name in got.keys() - want.keys()
        if with_optional and not got[name].optional
    ]
    for name in want.keys() & got.keys():
        tensor, row = got[name], want[name]
        dtype = model_config_pb2.DataType.Name(tensor.data_type)
        if dtype != _dtype(row["dtype"]):
            problems.append(f"{kind} {name}: data_type {dtype}, expected {_dtype(row['dtype'])}")
        if list(tensor.dims) != row["dims"]:
            problems.append(f"{kind} {name}: dims {list(tensor.dims)}, expected {row['dims']}")
        if with_optional and tensor.optional != row["optional"]:
            problems.append(
                f"{kind} {name}: optional {tensor.optional}, expected {row['optional']}"
            )
    return problems


# Our tensors beyond NVIDIA's (the config's header documents each).
OUR_INPUTS = {
    "input_ids", "sampling_param_n", "sampling_param_min_tokens",
    "sampling_param_repetition_penalty", "sampling_param_length_penalty",
    "sampling_param_ignore_eos", "sampling_param_end_id", "sampling_param_pad_id",
    "sampling_param_stop_token_ids", "sampling_param_bad", "sampling_param_bad_token_ids",
    "sampling_param_logprobs", "sampling_param_prompt_logprobs", "guided_decoding_guide_type",
    "guided_decoding_guide", "images",
}  # fmt: skip
OUR_OUTPUTS = {
    "output_ids", "sequence_index", "output_log_probs", "output_top_token_ids",
    "output_top_log_probs", "cached_tokens", "prompt_log_probs", "prompt_top_token_ids",
    "prompt_top_log_probs", "prompt_token_ranks",
}  # fmt: skip


def test_config_is_a_superset_of_the_contract_tensor_by_tensor() -> None:
    config = parse_config(CONFIG.read_text(), source=str(CONFIG))
    problems = _differences("input", list(config.input), CONTRACT["inputs"], True)
    problems += _differences("output", list(config.output), CONTRACT["outputs"], False)
    assert problems == [], "\n".join(problems)
    assert len(CONTRACT["inputs"]) == 22 and len(CONTRACT["outputs"]) == 16
    nvidia_inputs = {row["name"] for row in CONTRACT["inputs"]}
    nvidia_outputs = {row["name"] for row in CONTRACT["outputs"]}
    assert {t.name for t in config.input} - nvidia_inputs == OUR_INPUTS
    assert {t.name for t in config.output} - nvidia_outputs == OUR_OUTPUTS
    header = CONFIG.read_text().split("\nname:", 1)[0]
    documented = {name for name in OUR_INPUTS | OUR_OUTPUTS if name in header}
    documented |= {name for name in OUR_INPUTS if name.removeprefix("sampling_param_") in header}
    assert documented == OUR_INPUTS | OUR_OUTPUTS


def test_sampling_param_inputs_name_sampling_params_fields() -> None:
    """`sampling_param_<field>`: <field> is a tensorrt_llm.SamplingParams field (the LLM API's
    names, from the contract data the fake-module test also reads)."""
    api = json.loads((Path(__file__).parents[2] / "data" / "llmapi_python_api.json").read_text())
    config = parse_config(CONFIG.read_text(), source=str(CONFIG))
    for tensor in config.input:
        if tensor.name.startswith("sampling_param_"):
            assert tensor.name.removeprefix("sampling_param_") in api["SamplingParams"], tensor.name


def test_config_model_settings_match_nvidia() -> None:
    config = parse_config(CONFIG.read_text(), source=str(CONFIG))
    model = CONTRACT["model"]
    assert (config.name, config.backend) == (model["name"], model["backend"])
    assert [(g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in
            config.instance_group] == [(1, "KIND_CPU")]  # fmt: skip
    # max_batch_size and decoupled come from model.yaml's triton_config, never from the config.
    assert config.max_batch_size == 0
    assert not config.HasField("model_transaction_policy")
    assert "max_batch_size" not in CONFIG.read_text().split("#")[0]


def test_template_model_yaml_keeps_nvidias_keys() -> None:
    data = yaml.safe_load(TEMPLATE_YAML.read_text())
    assert list(data) == CONTRACT["model_yaml_keys"]
    assert list(data["triton_config"]) == CONTRACT["triton_config_keys"]
    assert data["backend"] == "pytorch"
    assert data["triton_config"] == {"max_batch_size": 0, "decoupled": True}


def test_llm_args_are_yaml_typed_and_dotted_keys_nest() -> None:
    args = parse_llm_args(
        [
            "kv_cache_config.free_gpu_memory_fraction=0.85",
            "kv_cache_config.enable_block_reuse=false",
            "enable_chunked_prefill=true",
            "cuda_graph_config={batch_sizes: [1, 2, 4], enable_padding: true}",
            "max_num_tokens=8192",
            "trust_remote_code=",
            "attn_backend=TRTLLM",
        ]
    )
    assert args == {
        "kv_cache_config": {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": False},
        "enable_chunked_prefill": True,
        "cuda_graph_config": {"batch_sizes": [1, 2, 4], "enable_padding": True},
        "max_num_tokens": 8192,
        "trust_remote_code": None,
        "attn_backend": "TRTLLM",
    }


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("no_equals_sign", "KEY=VALUE"),
        ("=1", "KEY=VALUE"),
        ("a..b=1", "KEY=VALUE"),
        ("model=/elsewhere", "set by pack_model itself"),
        ("triton_config.decoupled=false", "set by pack_model itself"),
        ("tensor_parallel_size=8", "set by pack_model itself"),
        ("x=[1, 2", "not a YAML value"),
    ],
)
def test_bad_llm_args_say_what_to_fix(item: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        parse_llm_args([item])


def test_a_key_cannot_be_both_a_value_and_a_section() -> None:
    with pytest.raises(TemplateError, match="already"):
        parse_llm_args(["kv_cache_config=1", "kv_cache_config.x=2"])
    with pytest.raises(TemplateError, match="already"):
        parse_llm_args(["kv_cache_config.x=2", "kv_cache_config=1"])


def test_model_yaml_holds_parallelism_and_llm_args() -> None:
    data = build_model_yaml(
        model="checkpoint", tp_size=2, pp_size=4, llm_args={"max_batch_size": 32}
    )
    assert data == {
        "model": "checkpoint",
        "backend": "pytorch",
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 4,
        "triton_config": {"max_batch_size": 0, "decoupled": True},
        "guided_decoding_backend": "xgrammar",  # the LLM API drops guides silently without it
        "max_batch_size": 32,
    }
    off = build_model_yaml(model="checkpoint", llm_args={"guided_decoding_backend": None})
    assert off["guided_decoding_backend"] is None
    with pytest.raises(TemplateError, match="backend"):
        build_model_yaml(model="checkpoint", backend="tensorrt")


def test_written_repository_loads_and_localizes(tmp_path: Path) -> None:
    model_root = tmp_path / "model"
    (model_root / "checkpoint").mkdir(parents=True)
    repository = write_llmapi_repository(
        model_root / "model_repository", build_model_yaml(model="checkpoint")
    )
    version_dir = repository / MODEL_NAME / "1"
    assert sorted(p.name for p in version_dir.iterdir()) == ["model.py", "model.yaml"]
    assert (repository / MODEL_NAME / "config.pbtxt").read_text() == CONFIG.read_text()
    assert configured_model(repository / MODEL_NAME) == "bentotrtllm"
    assert yaml.safe_load((version_dir / "model.yaml").read_text())["model"] == "checkpoint"

    assert localize_model_yaml(repository, model_root) == [version_dir / "model.yaml"]
    localized = yaml.safe_load((version_dir / "model.yaml").read_text())
    assert localized["model"] == str(model_root / "checkpoint")
    assert localized["tensor_parallel_size"] == 1
    assert localize_model_yaml(repository, model_root) == []  # absolute now: left alone


def test_a_hub_id_is_not_localized(tmp_path: Path) -> None:
    repository = write_llmapi_repository(
        tmp_path / "repo", build_model_yaml(model="TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    )
    assert localize_model_yaml(repository, tmp_path) == []
