"""Inspect an engine directory: a compiled TensorRT-LLM engine or our CPU stand-in.

Reads ``config.json`` in both TensorRT-LLM layouts (>= 0.9: ``pretrained_config`` +
``build_config``; older: ``builder_config`` + ``plugin_config``) and the CPU engine's layout,
checks that the per-rank engine files match ``world_size = tp * pp``, and summarizes what the
service needs (limits for request validation) and what the model store should show (metadata).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from .quantization import Quantization, from_checkpoint, from_engine_config

EngineKind = Literal["tensorrt_llm", "cpu"]

# Which TensorRT-LLM release the tensorrtllm backend in an NGC `<tag>-trtllm-python-py3` image
# ships; engines only load in the release that built them.
NGC_TRTLLM_VERSIONS: dict[str, str] = {
    "24.03": "0.8.0",
    "24.04": "0.9.0",
    "24.05": "0.10.0",
    "24.06": "0.10.0",
    "24.07": "0.11.0",
    "24.08": "0.12.0",
    "24.09": "0.13.0",
    "24.10": "0.14.0",
    "24.11": "0.15.0",
    "24.12": "0.16.0",
    "25.01": "0.17.0",
    "25.02": "0.17.0",
    "25.03": "0.18.0",
    "25.06": "0.20.0",
    "25.07": "0.20.0",
    "25.08": "0.21.0",
    "25.09": "1.0.0",
    "25.10": "1.0.0",
    "25.12": "1.1.0",
}


class EngineConfigError(ValueError):
    """The engine directory cannot be served; the message says what to fix."""


class PackedSummary(BaseModel):
    """What engine and checkpoint summaries share: the tp x pp layout of the ranks that serve
    them, and a flat view for the BentoML model's metadata. Subclasses declare `tp_size`,
    `pp_size`, `path` and the list of files named by FILES (counted in the metadata)."""

    FILES: ClassVar[str]

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size  # type: ignore[attr-defined]

    def metadata(self) -> dict[str, Any]:
        """Flat, JSON-friendly summary for the BentoML model's metadata."""
        data = self.model_dump(mode="json", exclude={"path", self.FILES})
        data["world_size"] = self.world_size
        data[self.FILES] = len(getattr(self, self.FILES))
        # BentoML's metadata takes no None, nested ones included (a quantization's group size).
        return {
            key: {k: v for k, v in value.items() if v is not None}
            if isinstance(value, dict)
            else value
            for key, value in data.items()
            if value is not None
        }


def read_config_json(
    directory: Path, what: str, missing: str, error: type[ValueError]
) -> dict[str, Any]:
    """The object in `directory`/config.json; `error` says what is wrong with it.

    `what` names the directory in messages ("engine directory"); `missing` is the message when
    config.json is not there (it says how to point at the right directory).
    """
    if not directory.exists():
        raise error(f"{what} {directory} does not exist")
    if not directory.is_dir():
        raise error(f"{directory} is not a directory")
    path = directory / "config.json"
    if not path.is_file():
        raise error(missing)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise error(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object")
    return data


class EngineInfo(PackedSummary):
    """What an engine directory holds, as far as serving it is concerned."""

    FILES = "engine_files"

    kind: EngineKind
    path: Path
    version: str | None = Field(None, description="TensorRT-LLM version that built the engine")
    architecture: str | None = None
    dtype: str | None = None
    vocab_size: int | None = None
    tp_size: int = 1
    pp_size: int = 1
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_beam_width: int = 1
    max_num_tokens: int | None = None
    lora_enabled: bool = False
    engine_files: list[str] = Field(default_factory=list)
    cpu_mode: str | None = None
    # Tokens per paged KV-cache block (plugin_config): reused blocks x this = cached tokens.
    tokens_per_block: int | None = None
    # Whether the engine returns its prompt's logits (trtllm-build --gather_context_logits):
    # prompt log probs come from them. Always for the CPU engine.
    gather_context_logits: bool = False
    quantization: Quantization | None = None  # what trtllm-build was given

    @property
    def max_output_len(self) -> int:
        return self.max_seq_len - 1


def _optional_int(section: dict[str, Any], key: str) -> int | None:
    value = section.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _int(section: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        if value is None:
            raise EngineConfigError(f"config.json: {where}.{key} is missing")
        raise EngineConfigError(
            f"config.json: {where}.{key} must be a positive integer, got {value!r}"
        )
    return value


_RANK_FILE = re.compile(r"rank(\d+)\.engine$")


def _check_rank_files(engine_dir: Path, world_size: int) -> list[str]:
    entries = sorted(engine_dir.glob("*.engine"))
    unreadable = [p.name for p in entries if not p.is_file()]
    if unreadable:
        raise EngineConfigError(
            f"{engine_dir}: {unreadable} are not regular files (dangling links or directories): "
            "copy the real engine files there"
        )
    files = [p.name for p in entries]
    if not files:
        raise EngineConfigError(
            f"no *.engine files in {engine_dir}: build the engines with trtllm-build first"
        )
    ranks = {int(m.group(1)) for name in files if (m := _RANK_FILE.search(name))}
    missing = sorted(set(range(world_size)) - ranks)
    if missing:
        raise EngineConfigError(
            f"{engine_dir} is missing engine files for rank(s) {missing}: world_size = tp_size x "
            f"pp_size = {world_size} needs rank0..rank{world_size - 1}.engine, found {files}"
        )
    extra = sorted(ranks - set(range(world_size)))
    if extra:
        raise EngineConfigError(
            f"{engine_dir} has engine files for rank(s) {extra} beyond world_size {world_size} "
            f"(tp_size x pp_size in config.json): the directory mixes builds"
        )
    return files


def _inspect_modern(
    engine_dir: Path, data: dict[str, Any], where: str = "build_config"
) -> EngineInfo:
    """Read a config.json of TensorRT-LLM >= 0.9 (or one translated from an older layout, whose
    limits section errors name as `where`)."""
    pretrained = data.get("pretrained_config") or {}
    build = data.get("build_config") or {}
    if not isinstance(pretrained, dict) or not isinstance(build, dict):
        raise EngineConfigError("config.json: pretrained_config and build_config must be objects")
    mapping = pretrained.get("mapping") or {}
    tp = _int(mapping, "tp_size", "pretrained_config.mapping", 1)
    pp = _int(mapping, "pp_size", "pretrained_config.mapping", 1)
    declared = mapping.get("world_size")
    if declared is not None and declared != tp * pp:
        raise EngineConfigError(
            f"config.json: mapping.world_size is {declared} but tp_size x pp_size = {tp * pp}"
        )
    max_input_len = _int(build, "max_input_len", where)
    max_seq_len = build.get("max_seq_len")
    if max_seq_len is None and "max_output_len" in build:  # 0.9 wrote max_output_len
        max_seq_len = max_input_len + _int(build, "max_output_len", where)
    cpu = data.get("cpu_engine")
    kind: EngineKind = "cpu" if isinstance(cpu, dict) else "tensorrt_llm"
    files = [] if kind == "cpu" else _check_rank_files(engine_dir, tp * pp)
    plugins = build.get("plugin_config") or {}
    lora_config = build.get("lora_config") or {}
    return EngineInfo(
        kind=kind,
        path=engine_dir,
        version=str(data["version"]) if "version" in data else None,
        architecture=pretrained.get("architecture"),
        dtype=pretrained.get("dtype"),
        vocab_size=pretrained.get("vocab_size"),
        tp_size=tp,
        pp_size=pp,
        max_batch_size=_int(build, "max_batch_size", where),
        max_input_len=max_input_len,
        max_seq_len=_int({"max_seq_len": max_seq_len}, "max_seq_len", where),
        max_beam_width=_int(build, "max_beam_width", where, 1),
        max_num_tokens=build.get("max_num_tokens"),
        lora_enabled=bool(plugins.get("lora_plugin")) or bool(lora_config.get("lora_dir")),
        engine_files=files,
        cpu_mode=cpu.get("mode") if isinstance(cpu, dict) else None,
        tokens_per_block=_optional_int(plugins, "tokens_per_block"),
        gather_context_logits=kind == "cpu"
        or bool(build.get("gather_context_logits") or build.get("gather_all_token_logits")),
        quantization=from_engine_config(data) or _cpu_checkpoint_quantization(engine_dir, cpu),
    )


def _cpu_checkpoint_quantization(engine_dir: Path, cpu: Any) -> Quantization | None:
    """The quantization of the checkpoint a CPU engine (hf mode) serves: the stand-in dequantizes
    ModelOpt's checkpoints, and the record says what it serves."""
    if not isinstance(cpu, dict) or cpu.get("mode") != "hf":
        return None
    checkpoint = cpu.get("checkpoint_dir")
    if not isinstance(checkpoint, str):
        return None
    try:
        return from_checkpoint(engine_dir / checkpoint)  # an absolute path stays as it is
    except ValueError as error:
        raise EngineConfigError(str(error)) from None


# The limits of TensorRT-LLM < 0.9's builder_config, under the names build_config uses today.
_LEGACY_LIMITS = (
    "max_batch_size",
    "max_input_len",
    "max_output_len",
    "max_beam_width",
    "max_num_tokens",
)


def _legacy_as_modern(data: dict[str, Any]) -> dict[str, Any]:
    """A config.json of TensorRT-LLM < 0.9 (builder_config + plugin_config) in today's layout, so
    one reader serves both. Values whose names change are checked under their old names here."""
    builder = data["builder_config"]
    if not isinstance(builder, dict):
        raise EngineConfigError("config.json: builder_config must be an object")
    _int(builder, "max_output_len", "builder_config")  # the sequence length is input + output
    version = builder.get("tensorrt_llm_version") or builder.get("version")
    return {
        **({"version": version} if version else {}),
        "pretrained_config": {
            "architecture": builder.get("name"),
            "dtype": builder.get("precision"),
            "vocab_size": builder.get("vocab_size"),
            "mapping": {
                "tp_size": _int(builder, "tensor_parallel", "builder_config", 1),
                "pp_size": _int(builder, "pipeline_parallel", "builder_config", 1),
            },
        },
        "build_config": {
            **{key: value for key, value in builder.items() if key in _LEGACY_LIMITS},
            "plugin_config": data.get("plugin_config") or {},
        },
    }


def inspect_engine(engine_dir: Path | str) -> EngineInfo:
    """Read and check an engine directory; raise EngineConfigError naming what is wrong."""
    engine_dir = Path(engine_dir)
    data = read_config_json(
        engine_dir,
        "engine directory",
        f"{engine_dir / 'config.json'} is missing: point --engine-dir at the output directory "
        "of trtllm-build",
        EngineConfigError,
    )
    if "builder_config" in data:
        info = _inspect_modern(engine_dir, _legacy_as_modern(data), where="builder_config")
    elif "build_config" in data or "pretrained_config" in data:
        info = _inspect_modern(engine_dir, data)
    else:
        raise EngineConfigError(
            f"{engine_dir / 'config.json'} has neither build_config/pretrained_config "
            "(TensorRT-LLM >= 0.9) nor builder_config (older): is this an engine directory?"
        )
    if info.max_seq_len <= info.max_input_len:
        raise EngineConfigError(
            f"config.json: max_seq_len ({info.max_seq_len}) must exceed max_input_len "
            f"({info.max_input_len}) to leave room for generated tokens"
        )
    return info


def _major_minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_runtime_compatibility(info: EngineInfo, runtime_version: str | None) -> None:
    """Engines load only in the TensorRT-LLM release that built them (same major.minor)."""
    if info.kind != "tensorrt_llm" or not info.version or not runtime_version:
        return
    built, runtime = _major_minor(info.version), _major_minor(runtime_version)
    if built and runtime and built != runtime:
        raise EngineConfigError(
            f"the engine was built by TensorRT-LLM {info.version} but the serving image runs "
            f"TensorRT-LLM {runtime_version}: rebuild the engine with {runtime_version} or pick the "
            f"matching tritonserver <tag>-trtllm-python-py3 image (pack_model --target-image)"
        )


def runtime_version_for_image(image: str) -> str | None:
    """The TensorRT-LLM release inside an NGC tritonserver trtllm image, when known."""
    match = re.search(r"tritonserver:(\d{2}\.\d{2})-trtllm", image)
    return NGC_TRTLLM_VERSIONS.get(match.group(1)) if match else None
