# ruff: noqa: F811  (fixtures shared with test_pack_model are imported, then requested)
"""pack_model.py --workflow llmapi against checkpoints in Hugging Face's own format: what is
stored (model.yaml, hard links, metadata), and bad checkpoints as clear errors that store nothing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import bentoml
import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file
from test_pack_model import name, run_pack, unchanged_store  # noqa: F401
from transformers import LlamaConfig, Qwen2Config

from tensorrtllm_backend.packing.llmapi_repository import build_model_yaml
from tensorrtllm_backend.triton.localize import localize_repository

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def make_checkpoint(path: Path, tokenizer_source: Path, config=None, shards: int = 1) -> Path:
    """config.json as transformers writes it, safetensors weights (sharded with an index when
    shards > 1) and the demo tokenizer."""
    config = config or LlamaConfig(
        vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
        dtype="bfloat16",
    )  # fmt: skip
    config.architectures = [type(config).__name__.replace("Config", "ForCausalLM")]
    config.save_pretrained(path)
    if shards == 1:
        save_file({"lm_head.weight": np.zeros((2, 2), np.float32)}, path / "model.safetensors")
    else:
        weight_map = {}
        for i in range(shards):
            shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file({f"w{i}": np.zeros((2, 2), np.float32)}, path / shard)
            weight_map[f"w{i}"] = shard
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for file in TOKENIZER_FILES:
        shutil.copy(tokenizer_source / file, path / file)
    return path


@pytest.fixture
def checkpoint(tmp_path: Path, demo_checkpoint: Path) -> Path:
    return make_checkpoint(tmp_path / "Llama-Tiny", demo_checkpoint)


def llmapi(*args: object) -> int:
    return run_pack("--workflow", "llmapi", *map(str, args))


def test_pack_stores_checkpoint_tokenizer_and_model_yaml(checkpoint, name, capsys) -> None:
    (checkpoint / "original").mkdir()  # a second copy of the weights that must not be stored
    (checkpoint / "original" / "consolidated.00.pth").write_bytes(b"x" * 64)
    (checkpoint / "pytorch_model.bin").write_bytes(b"x" * 64)
    code = llmapi(
        "--checkpoint", checkpoint, "--name", name, "--tp", 2, "--pp", 2, "--gpus", 4,
        "--max-batch-size", 16, "--llm-arg", "kv_cache_config.free_gpu_memory_fraction=0.8",
        "--llm-arg", "enable_chunked_prefill=true", "--llm-arg", "cuda_graph_config.max_batch_size=16",
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    model = bentoml.models.get(f"{name}:latest")
    try:
        root = Path(model.path)
        settings = yaml.safe_load(
            (root / "model_repository" / "tensorrt_llm" / "1" / "model.yaml").read_text()
        )
        # The --llm-arg values arrive YAML-typed and nested; the rest is build_model_yaml's own.
        llm_args = {
            "kv_cache_config": {"free_gpu_memory_fraction": 0.8},
            "enable_chunked_prefill": True,
            "cuda_graph_config": {"max_batch_size": 16},
            "max_batch_size": 16,
        }
        assert settings == build_model_yaml(
            model="checkpoint", tp_size=2, pp_size=2, llm_args=llm_args
        )
        stored = sorted(p.name for p in (root / "checkpoint").iterdir())
        assert stored == ["config.json", "model.safetensors", *TOKENIZER_FILES]
        for rel in (
            "checkpoint/model.safetensors",
            "checkpoint/config.json",
            "tokenizer/tokenizer.json",
        ):
            source = checkpoint / Path(rel).name
            assert os.stat(root / rel).st_ino == os.stat(source).st_ino  # hard links, no copy
        metadata = model.info.metadata
        assert metadata["workflow"] == metadata["route"] == "llmapi"
        assert metadata["engine_world_size"] == 4 and metadata["engine_kind"] == "llmapi"
        assert metadata["checkpoint_architecture"] == "LlamaForCausalLM"
        assert metadata["checkpoint_dtype"] == "bfloat16"
        manifest = json.loads((root / "trtllm_model.json").read_text())
        assert manifest["workflow"] == "llmapi"
        assert manifest["limits"] == {"max_input_len": 4095, "max_seq_len": 4096,
                                      "max_batch_size": 16}  # fmt: skip

        localized = localize_repository(root / "model_repository", root.parent / "run", root)
        model_yaml = localized / "tensorrt_llm" / "1" / "model.yaml"
        assert yaml.safe_load(model_yaml.read_text())["model"] == str(root / "checkpoint")
    finally:
        shutil.rmtree(root.parent / "run", ignore_errors=True)
        bentoml.models.delete(str(model.tag))


def test_sharded_qwen_checkpoint_dry_run(tmp_path, demo_checkpoint, name, unchanged_store, capsys):
    config = Qwen2Config(
        vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    ckpt = make_checkpoint(tmp_path / "qwen", demo_checkpoint, config, shards=3)
    assert llmapi("--checkpoint", ckpt, "--name", name, "--max-input-len", 512, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "Qwen2ForCausalLM" in out and "max_input_len=512 max_seq_len=1024" in out
    assert "dry run: nothing stored" in out


def _edit_config(checkpoint: Path, **changes: object) -> None:
    path = checkpoint / "config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _no_config(c: Path) -> None:
    (c / "config.json").unlink()


def _bad_json(c: Path) -> None:
    (c / "config.json").write_text("{not json")


def _unknown_architecture(c: Path) -> None:
    _edit_config(c, architectures=["BloomForCausalLM"])


def _no_architectures(c: Path) -> None:
    _edit_config(c, architectures=[])


def _bad_dtype(c: Path) -> None:
    _edit_config(c, dtype="int8", torch_dtype="int8")


def _no_tokenizer(c: Path) -> None:
    for file in TOKENIZER_FILES:
        (c / file).unlink()


def _broken_tokenizer(c: Path) -> None:
    (c / "tokenizer.json").write_text("{}")


def _bin_weights_only(c: Path) -> None:
    (c / "model.safetensors").rename(c / "pytorch_model.bin")


def _index_names_missing_shard(c: Path) -> None:
    index = {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (c / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_no_config, "has no config.json"),
        (_bad_json, "is not valid JSON"),
        (_unknown_architecture, "'BloomForCausalLM' is not one TensorRT-LLM's PyTorch backend"),
        (_no_architectures, "names no `architectures`"),
        (_bad_dtype, "dtype 'int8'"),
        (_no_tokenizer, "no tokenizer in"),
        (_broken_tokenizer, "cannot load the tokenizer"),
        (_bin_weights_only, "no \\*.safetensors weights"),
        (_index_names_missing_shard, "missing weight shard\\(s\\) model-00002-of-00002"),
    ],
)
def test_bad_checkpoint_is_a_clear_error_and_stores_nothing(
    checkpoint,
    name,
    unchanged_store,
    capsys,
    damage,
    message,
) -> None:
    damage(checkpoint)
    assert llmapi("--checkpoint", checkpoint, "--name", name) == 2
    err = capsys.readouterr().err
    assert "pack_model: error: " in err
    assert pytest.importorskip("re").search(message, err), err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tp", 3), "--tp 3 does not divide the model's 32 attention heads"),
        (("--pp", 8), "--pp 8 exceeds the model's 4 layers"),
        (("--tp", 2, "--pp", 2, "--gpus", 2), "needs 4 GPUs, but --gpus is 2"),
        (("--tp", 0), "--tp must be a whole number >= 1"),
        (("--max-input-len", 4096), "must be below max_seq_len 4096"),
        (("--llm-arg", "model=/x"), "set by pack_model itself"),
        (("--llm-arg", "oops"), "expects KEY=VALUE"),
        (("--route", "bls"), "belong to the engine workflow"),
        (("--fill", "a=b"), "belong to the engine workflow"),
    ],
)
def test_bad_options_are_clear_errors(checkpoint, name, unchanged_store, capsys, args, message):
    assert llmapi("--checkpoint", checkpoint, "--name", name, *args) == 2
    assert message in capsys.readouterr().err


def test_a_checkpoint_packs_for_the_llmapi_workflow_by_default(
    checkpoint, name, unchanged_store, capsys
) -> None:
    assert run_pack("--checkpoint", str(checkpoint), "--name", name, "--dry-run") == 0
    assert "workflow:     llmapi" in capsys.readouterr().out
    assert run_pack("--workflow", "engine", "--checkpoint", str(checkpoint), "--name", name) == 2
    assert "leave out --workflow engine" in capsys.readouterr().err


def test_llmapi_options_are_refused_by_the_engine_workflow(name, unchanged_store, capsys) -> None:
    args = ("--workflow", "engine", "--synthetic", "--name", name, "--llm-arg", "a=1")
    assert run_pack(*args) == 2
    assert "belong to --workflow llmapi" in capsys.readouterr().err


def test_llmapi_workflow_needs_a_checkpoint(tmp_path, name, unchanged_store, capsys) -> None:
    assert run_pack("--workflow", "llmapi", "--hf-model", str(tmp_path), "--name", name) == 2
    assert "packs --checkpoint DIR (or --demo, --synthetic)" in capsys.readouterr().err


def test_synthetic_llmapi_model_is_a_cpu_engine_dir_with_its_tokenizer(name, capsys) -> None:
    """--synthetic --workflow llmapi: the CPU stand-in's synthetic engine as the model, for
    benchmarks of the llmapi route; no logits, so no guides."""
    code = run_pack(
        "--synthetic", "--workflow", "llmapi", "--itl-ms", "3", "--max-input-len", "512",
        "--max-seq-len", "1024",
        "--name", name,
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    model = bentoml.models.get(f"{name}:latest")
    try:
        root = Path(model.path)
        engine = json.loads((root / "checkpoint" / "config.json").read_text())
        assert engine["cpu_engine"]["mode"] == "synthetic" and engine["cpu_engine"]["itl_ms"] == 3
        assert (root / "checkpoint" / "tokenizer.json").is_file()
        settings = yaml.safe_load(
            (root / "model_repository" / "tensorrt_llm" / "1" / "model.yaml").read_text()
        )
        assert settings["model"] == "checkpoint" and settings["guided_decoding_backend"] is None
        assert settings["max_seq_len"] == engine["build_config"]["max_seq_len"] == 1024
        manifest = json.loads((root / "trtllm_model.json").read_text())
        assert (manifest["source"], manifest["llmapi_model"]) == ("synthetic", "bentotrtllm")
        assert model.info.metadata["engine_kind"] == "cpu"
    finally:
        bentoml.models.delete(str(model.tag))


def test_nvidias_model_is_selectable(checkpoint, name, capsys) -> None:
    from tensorrtllm_backend.python_models.llmapi_choice import configured_model

    code = llmapi("--checkpoint", checkpoint, "--name", name, "--llmapi-model", "nvidia")
    assert code == 0, capsys.readouterr().err
    model = bentoml.models.get(f"{name}:latest")
    try:
        root = Path(model.path)
        assert configured_model(root / "model_repository" / "tensorrt_llm") == "nvidia"
        assert json.loads((root / "trtllm_model.json").read_text())["llmapi_model"] == "nvidia"
    finally:
        bentoml.models.delete(str(model.tag))


def test_missing_checkpoint_dir(tmp_path, name, unchanged_store, capsys) -> None:
    assert llmapi("--checkpoint", tmp_path / "nope", "--name", name) == 2
    assert "does not exist" in capsys.readouterr().err


def test_serving_plan_of_a_packed_checkpoint(checkpoint, name, capsys, monkeypatch) -> None:
    """What the service derives from the stored workflow: the llmapi route, limits from the
    manifest, one tritonserver with auto-complete on (the LLM API starts its tp x pp ranks
    itself), and one GPU per rank asked of BentoML."""
    from tensorrtllm_backend.serving.deployment import resources
    from tensorrtllm_backend.serving.runtime import LLMRuntime
    from tensorrtllm_backend.serving.triton_paths import Route
    from tensorrtllm_backend.settings import Settings
    from tensorrtllm_backend.triton.command import TritonPorts, TritonServerConfig, build_command
    from tensorrtllm_backend.triton.install import TritonInstallation

    assert llmapi("--checkpoint", checkpoint, "--name", name, "--tp", 2, "--pp", 2) == 0, (
        capsys.readouterr().err
    )
    model = bentoml.models.get(f"{name}:latest")
    try:
        monkeypatch.delenv("TRTLLM_GPU_TYPE", raising=False)
        assert resources(str(model.tag)) == {"gpu": 4}
        runtime = LLMRuntime(Path(model.path))
        assert runtime.route is Route.LLMAPI and runtime.launch_ranks == 1
        assert (runtime.limits.max_input_len, runtime.limits.max_seq_len) == (4095, 4096)
        assert runtime._models_to_load() == ("tensorrt_llm",)
        config = TritonServerConfig(
            model_repository=Path(model.path), world_size=1, auto_complete_config=True
        )
        argv = build_command(
            TritonInstallation(Path("/opt/tritonserver/bin/tritonserver")),
            config,
            TritonPorts(1, 2, 3),
        )
        assert "--disable-auto-complete-config" not in argv and "mpirun" not in argv
        with pytest.raises(ValueError, match="does not fit a model packed with the llmapi"):
            LLMRuntime(Path(model.path), Settings(route=Route.DIRECT.value))
    finally:
        bentoml.models.delete(str(model.tag))


def test_target_image_must_ship_trtllm_1(checkpoint, name, unchanged_store, capsys) -> None:
    image = "nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3"
    assert llmapi("--checkpoint", checkpoint, "--name", name, "--target-image", image) == 2
    assert "ships TensorRT-LLM 0.20.0; the llmapi workflow needs >= 1.0" in capsys.readouterr().err
    image = "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3"
    args = ("--checkpoint", checkpoint, "--name", name, "--target-image", image, "--dry-run")
    assert llmapi(*args) == 0


def hf_adapter(path: Path, rank: int = 8) -> Path:
    """A Hugging Face (PEFT) LoRA adapter directory as save_pretrained writes it."""
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": rank, "target_modules": ["q_proj", "v_proj"]})
    )
    save_file({"lora_A": np.zeros((rank, 4), np.float32)}, path / "adapter_model.safetensors")
    return path


def test_lora_adapters_are_stored_and_configured(checkpoint, name, tmp_path, capsys) -> None:
    """Hugging Face adapters for the LLM API: stored under loras/, named in model.yaml's
    lora_config (localized with the model), sent by the llmapi route as id, name and path."""
    from tensorrtllm_backend.serving.generation import Generator
    from tensorrtllm_backend.serving.runtime import LLMRuntime
    from tensorrtllm_backend.serving.schemas import SamplingParams

    sql, chat = hf_adapter(tmp_path / "sql", 8), hf_adapter(tmp_path / "chat", 16)
    code = llmapi("--checkpoint", checkpoint, "--name", name, "--lora", f"sql={sql}",
                  "--lora", f"chat={chat}", "--llm-arg", "lora_config.max_cpu_loras=4")  # fmt: skip
    assert code == 0, capsys.readouterr().err
    model = bentoml.models.get(f"{name}:latest")
    root = Path(model.path)
    try:
        assert sorted(p.name for p in (root / "loras" / "sql").iterdir()) == [
            "adapter_config.json", "adapter_model.safetensors"
        ]  # fmt: skip
        yaml_path = root / "model_repository" / "tensorrt_llm" / "1" / "model.yaml"
        assert yaml.safe_load(yaml_path.read_text())["lora_config"] == {
            "lora_dir": ["loras/chat", "loras/sql"], "max_lora_rank": 16, "max_loras": 2,
            "max_cpu_loras": 4,
        }  # fmt: skip
        localized = localize_repository(root / "model_repository", root.parent / "run", root)
        settings = yaml.safe_load((localized / "tensorrt_llm" / "1" / "model.yaml").read_text())
        assert settings["lora_config"]["lora_dir"] == [
            str(root / "loras/chat"),
            str(root / "loras/sql"),
        ]
        runtime = LLMRuntime(root)
        assert runtime._lora_supported() and runtime.loras.names() == ["chat", "sql"]
        generator = Generator(
            None, demo_tokenizer_of(checkpoint), runtime.limits, runtime.route,  # type: ignore[arg-type]
            loras=runtime.loras, lora_supported=True,
        )  # fmt: skip
        prepared = generator.prepare("Hello", SamplingParams(max_tokens=2), lora="sql")
        tensors, _ = generator._triton_inputs(prepared, send_lora_weights=True)
        assert tensors["lora_name"].tolist() == [b"sql"]
        assert tensors["lora_path"].tolist() == [str(root / "loras" / "sql").encode()]
        assert tensors["lora_id"].tolist() == [runtime.loras.get("sql").task_id]
        assert "lora_weights" not in tensors
    finally:
        shutil.rmtree(root.parent / "run", ignore_errors=True)
        bentoml.models.delete(str(model.tag))


def demo_tokenizer_of(checkpoint: Path):
    from tensorrtllm_backend.common.tokenization import load_tokenizer

    return load_tokenizer(checkpoint)


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (lambda p: (p / "adapter_config.json").unlink(), "adapter_config.json is missing"),
        (lambda p: (p / "adapter_model.safetensors").unlink(), "no adapter weights"),
        (lambda p: (p / "adapter_config.json").write_text('{"r": 0}'), "must be a whole number"),
    ],
)
def test_bad_lora_adapters_say_what_is_wrong(
    checkpoint, name, tmp_path, unchanged_store, capsys, break_it, message
) -> None:
    adapter = hf_adapter(tmp_path / "adapter")
    break_it(adapter)
    assert llmapi("--checkpoint", checkpoint, "--name", name, "--lora", f"a={adapter}") == 2
    assert message in capsys.readouterr().err
