"""Pack a Hugging Face checkpoint for TensorRT-LLM's LLM API workflow (no engines).

Layout of a stored llmapi model (paths relative to the model's root, resolved at start)::

    checkpoint/         the Hugging Face checkpoint (config.json, *.safetensors, tokenizer, ...);
                        for --synthetic a CPU engine dir (config.json with a `cpu_engine`
                        section) with the tokenizer beside it, served by the CPU stand-in only
    tokenizer/          the tokenizer the service uses (hard links when on one filesystem); a
                        vision-language model's processor files too (AutoProcessor)
    model_repository/   tensorrt_llm/{config.pbtxt, 1/model.py, 1/model.yaml}
    loras/NAME/         Hugging Face LoRA adapters (--lora NAME=DIR), read by the LLM API
    trtllm_model.json   manifest: workflow "llmapi", checkpoint summary, limits, model.yaml;
                        `vision` for a vision-language model
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.cpu_engine_config import load_engine_config
from ..common.lora import LORAS, LoraError, check_hf_adapter_dir, check_name
from ..common.model_repository import LLMAPI_MODELS, TemplateError
from ..common.model_store import FORMAT, MANIFEST, REPOSITORY, TOKENIZER, VISION
from ..common.tokenization import record_tokenizer_class
from .checkpoint import CheckpointError, CheckpointInfo, describe_vision, inspect_checkpoint
from .engine_packing import TOKENIZER_FILES, PackError, check_tag, check_vision, copy_files
from .llmapi_repository import build_model_yaml, write_llmapi_repository

WORKFLOW = "llmapi"
CHECKPOINT = "checkpoint"
# Weights in formats the LLM API does not load from a checkpoint dir with safetensors: left out
# (a Llama 3 download carries a second full copy in original/*.pth).
SKIPPED_SUFFIXES = (".bin", ".pth", ".pt", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt")
CPU_SOURCES = ("demo", "synthetic")


@dataclass
class LlmapiPlan:
    """Everything an llmapi model stores, decided and validated before anything is written."""

    name: str
    checkpoint: CheckpointInfo
    tokenizer_dir: Path
    model_yaml: dict[str, Any]
    max_batch_size: int | None
    max_input_len: int
    max_seq_len: int
    source: str = "checkpoint"
    route: str = WORKFLOW
    llmapi_model: str = LLMAPI_MODELS[0]
    loras: dict[str, list[Path]] = field(default_factory=dict)  # name: its files
    labels: dict[str, str] = field(default_factory=dict)
    vision: dict[str, Any] | None = None  # the manifest's record of a vision-language model
    processor: list[tuple[Path, Path]] = field(default_factory=list)  # its processor's files

    def files(self) -> list[tuple[Path, Path]]:
        """(source file, path inside the model): the checkpoint's top-level files, then the
        tokenizer's (and a vision-language model's processor's)."""
        root = self.checkpoint.path
        pairs = [
            (path, Path(CHECKPOINT) / path.name)
            for path in sorted(root.iterdir())
            if path.is_file() and not path.name.endswith(SKIPPED_SUFFIXES)
        ]
        pairs += [
            (self.tokenizer_dir / name, Path(TOKENIZER) / name)
            for name in TOKENIZER_FILES
            if (self.tokenizer_dir / name).is_file()
        ]
        pairs += self.processor
        pairs += [
            (path, Path(LORAS) / adapter / path.name)
            for adapter, paths in sorted(self.loras.items())
            for path in paths
        ]
        return pairs

    def total_bytes(self) -> int:
        return sum(src.stat().st_size for src, _ in self.files())

    @property
    def cpu(self) -> bool:
        """Served by the CPU stand-in (the demo, the synthetic engine); a real checkpoint asks
        BentoML for GPUs."""
        return self.source in CPU_SOURCES

    def _header(self) -> dict[str, Any]:
        """What the model store's metadata and the manifest both start with."""
        return {
            "format": FORMAT,
            "workflow": WORKFLOW,
            "source": self.source,
            "route": self.route,
            "llmapi_model": self.llmapi_model,
        }

    def metadata(self) -> dict[str, Any]:
        return {
            **self._header(),
            # What deployment.resources() reads: one GPU per rank of the LLM API's world.
            "engine_kind": "cpu" if self.cpu else "llmapi",
            "engine_world_size": self.checkpoint.world_size,
            **{f"checkpoint_{k}": v for k, v in self.checkpoint.metadata().items()},
        }

    def limits(self) -> dict[str, int]:
        limits = {"max_input_len": self.max_input_len, "max_seq_len": self.max_seq_len}
        if self.max_batch_size is not None:
            limits["max_batch_size"] = self.max_batch_size
        return limits

    def manifest(self) -> dict[str, Any]:
        return {
            **self._header(),
            "checkpoint": self.checkpoint.model_dump(mode="json", exclude={"path"}),
            "limits": self.limits(),
            "model_yaml": self.model_yaml,
            "loras": sorted(self.loras),
            **({VISION: self.vision} if self.vision is not None else {}),
        }

    def write_tree(self, root: Path, show_progress: bool = True) -> None:
        copy_files(self.files(), root, "checkpoint+tokenizer", show_progress)
        record_tokenizer_class(root / TOKENIZER)
        write_llmapi_repository(root / REPOSITORY, self.model_yaml, self.llmapi_model)
        (root / MANIFEST).write_text(json.dumps(self.manifest(), indent=2) + "\n")


def plan_llmapi(
    *,
    name: str,
    checkpoint_dir: Path,
    tokenizer_dir: Path | None = None,
    source: str = "checkpoint",
    tp_size: int = 1,
    pp_size: int = 1,
    gpus: int | None = None,
    backend: str = "pytorch",
    max_batch_size: int | None = None,
    max_input_len: int | None = None,
    max_seq_len: int | None = None,
    llm_args: dict[str, Any] | None = None,
    llmapi_model: str = LLMAPI_MODELS[0],
    loras: dict[str, Path] | None = None,
) -> LlmapiPlan:
    """Validate a checkpoint and decide what to store (raises PackError, writes nothing).
    `source` "synthetic": `checkpoint_dir` is a synthetic CPU engine dir, for the CPU stand-in."""
    check_tag(name)
    if llmapi_model not in LLMAPI_MODELS:
        raise PackError(f"--llmapi-model {llmapi_model!r}: use {' or '.join(LLMAPI_MODELS)}")
    try:
        if source == "synthetic":
            info = synthetic_info(checkpoint_dir)
        else:
            info = inspect_checkpoint(
                checkpoint_dir,
                tp_size=tp_size,
                pp_size=pp_size,
                gpus=gpus,
                tokenizer_dir=tokenizer_dir,
                stand_in=source in CPU_SOURCES,
            )
    except CheckpointError as error:
        raise PackError(str(error)) from error
    vision, processor = (
        check_vision(
            Path(checkpoint_dir).resolve(), Path(tokenizer_dir or checkpoint_dir).resolve()
        )
        if source != "synthetic"
        else (None, [])
    )
    args = dict(llm_args or {})
    adapters = _check_loras(loras or {})
    if adapters:  # --llm-arg lora_config.<field> settings win over the derived ones
        given = args.get("lora_config")
        args["lora_config"] = {
            **lora_config(adapters),
            **(given if isinstance(given, dict) else {}),
        }
    for key, value in (
        ("max_batch_size", max_batch_size),
        ("max_input_len", max_input_len),
        ("max_seq_len", max_seq_len),
    ):
        if value is not None:
            args[key] = value
    seq_len = args.get("max_seq_len") or info.max_position_embeddings
    if not isinstance(seq_len, int) or seq_len < 2:
        raise PackError(
            "the checkpoint's config.json has no max_position_embeddings: pass --max-seq-len"
        )
    input_len = args.get("max_input_len") or seq_len - 1
    if not isinstance(input_len, int) or not 0 < input_len < seq_len:
        raise PackError(
            f"max_input_len {input_len} must be below max_seq_len {seq_len}, leaving room "
            "for generated tokens"
        )
    try:
        model_yaml = build_model_yaml(
            model=CHECKPOINT, tp_size=tp_size, pp_size=pp_size, backend=backend, llm_args=args
        )
    except TemplateError as error:
        raise PackError(str(error)) from error
    batch = args.get("max_batch_size")
    return LlmapiPlan(
        name=name,
        checkpoint=info.model_copy(update={"path": Path(checkpoint_dir).resolve()}),
        tokenizer_dir=Path(tokenizer_dir or checkpoint_dir).resolve(),
        model_yaml=model_yaml,
        max_batch_size=batch if isinstance(batch, int) else None,
        max_input_len=input_len,
        max_seq_len=seq_len,
        source=source,
        llmapi_model=llmapi_model,
        loras={name: files for name, (_, files) in adapters.items()},
        labels={"engine": "cpu" if source in CPU_SOURCES else WORKFLOW, "source": source},
        vision=vision,
        processor=processor,
    )


def _check_loras(loras: dict[str, Path]) -> dict[str, tuple[int, list[Path]]]:
    """Each Hugging Face adapter's rank and files (PackError names what is wrong)."""
    checked = {}
    for name, path in loras.items():
        try:
            check_name(name)
            rank, files = check_hf_adapter_dir(Path(path))
        except LoraError as error:
            raise PackError(str(error)) from error
        checked[name] = (rank, [file.resolve() for file in files])
    return checked


def lora_config(adapters: dict[str, tuple[int, list[Path]]]) -> dict[str, Any]:
    """model.yaml's `lora_config` for the stored adapters: without one the LLM API ignores
    LoRA requests. Its fields (lora_dir, max_lora_rank, max_loras, max_cpu_loras) are
    LoraConfig's as read in TensorRT-LLM's source, not checked against a 1.2 install: pass
    --llm-arg lora_config.<field>=... to set it yourself. The adapter dirs are relative to the
    model's root until the service localizes them."""
    return {
        "lora_dir": [f"{LORAS}/{name}" for name in sorted(adapters)],
        "max_lora_rank": max(rank for rank, _ in adapters.values()),
        "max_loras": len(adapters),
        "max_cpu_loras": len(adapters),
    }


def synthetic_info(engine_dir: Path) -> CheckpointInfo:
    """A synthetic CPU engine dir described as the checkpoint the stand-in serves."""
    try:
        config = load_engine_config(engine_dir)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{engine_dir}: not a CPU engine dir: {error}") from error
    return CheckpointInfo(
        path=Path(engine_dir),
        architecture=config.pretrained_config.architecture,
        dtype=config.pretrained_config.dtype,
        vocab_size=config.pretrained_config.vocab_size,
        max_position_embeddings=config.build_config.max_seq_len,
    )


def describe_llmapi(pack: LlmapiPlan) -> str:
    info = pack.checkpoint
    quantization = (
        [f"quantization: {info.quantization.describe()}"] if info.quantization is not None else []
    )
    return "\n".join(
        [
            f"model:        {pack.name}",
            f"workflow:     llmapi ({pack.model_yaml['backend']} backend, {pack.llmapi_model} "
            f"model), {info.architecture}, {info.dtype}, tp={info.tp_size} pp={info.pp_size}",
            *quantization,
            *describe_vision(pack.vision),
            f"limits:       max_input_len={pack.max_input_len} max_seq_len={pack.max_seq_len}"
            f" max_batch_size={pack.max_batch_size or 'LLM API default'}",
            f"files:        {len(pack.files())} ({pack.total_bytes() / 1e6:.1f} MB) from "
            f"{info.path} and {pack.tokenizer_dir}",
            "llm args:     "
            + ", ".join(
                f"{k}={v}"
                for k, v in pack.model_yaml.items()
                if k not in ("model", "backend", "triton_config")
            ),
        ]
    )
