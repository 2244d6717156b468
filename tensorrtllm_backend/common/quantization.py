"""What quantization a packed model carries, read from its files, and the GPUs that run it.

Three places say it:
- a ModelOpt unified checkpoint's `hf_quant_config.json` (`quantization.quant_algo`: FP8,
  W4A16_AWQ, NVFP4, W4A8_AWQ...; `kv_cache_quant_algo`; `group_size`), which TensorRT-LLM's LLM
  API loads;
- a Hugging Face checkpoint's `quantization_config` in config.json (`quant_method`: modelopt,
  fp8, awq, gptq, compressed-tensors, ...);
- a TensorRT-LLM engine's config.json, `pretrained_config.quantization` (what trtllm-build was
  given: `quant_algo` W4A16_AWQ for the weight-only INT4 AWQ of `--use_weight_only
  --weight_only_precision int4_awq`, `kv_cache_quant_algo`, `group_size`).

Formats compute in low precision only on GPUs that have the instructions: FP8 from Ada / Hopper
(compute capability 8.9), FP4 (NVFP4, MXFP4) from Blackwell (10.0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

# The compute capability a format's kernels need, by the algorithm's upper-case name.
MIN_CAPABILITY: dict[str, tuple[float, str]] = {
    "FP8": (8.9, "Ada or Hopper (L4, L40S, H100, H200) or newer"),
    "FP8_BLOCK_SCALES": (9.0, "Hopper (H100, H200) or newer"),
    "FP8_PER_CHANNEL_PER_TOKEN": (8.9, "Ada or Hopper (L4, L40S, H100, H200) or newer"),
    "W4A8_AWQ": (8.9, "Ada or Hopper (L4, L40S, H100, H200) or newer"),
    "NVFP4": (10.0, "Blackwell (B200, GB200, RTX PRO 6000 Blackwell) or newer"),
    "W4A8_NVFP4_FP8": (10.0, "Blackwell (B200, GB200) or newer"),
    "MXFP4": (10.0, "Blackwell (B200, GB200) or newer"),
    "W4A16_AWQ": (8.0, "Ampere (A10, A100) or newer"),
    "W4A16_GPTQ": (8.0, "Ampere (A10, A100) or newer"),
}
# What the CPU stand-in dequantizes at load (python_models/cpu_engine/dequantize.py), by
# ModelOpt's quant_algo; a KV cache in FP8 too.
CPU_FORMATS = ("FP8", "W4A16_AWQ", "W4A8_AWQ")
# BentoCloud's GPU type names (TRTLLM_GPU_TYPE, pack_model.py --gpu-type) by compute capability.
GPU_CAPABILITY: dict[str, float] = {
    "nvidia-tesla-t4": 7.5,
    "nvidia-t4": 7.5,
    "nvidia-a10g": 8.6,
    "nvidia-tesla-a10g": 8.6,
    "nvidia-a100-40gb": 8.0,
    "nvidia-a100-80gb": 8.0,
    "nvidia-tesla-a100": 8.0,
    "nvidia-l4": 8.9,
    "nvidia-l40s": 8.9,
    "nvidia-h100-80gb": 9.0,
    "nvidia-h100": 9.0,
    "nvidia-h200": 9.0,
    "nvidia-h200-141gb": 9.0,
    "nvidia-b200": 10.0,
    "nvidia-gb200": 10.0,
}


class Quantization(BaseModel):
    """A model's quantization: the algorithm (TensorRT-LLM's QuantAlgo name where one applies),
    its weight group size, the KV cache's, and which file said so."""

    algorithm: str
    group_size: int | None = None
    kv_cache: str | None = None
    source: str

    def describe(self) -> str:
        parts = [self.algorithm]
        if self.group_size:
            parts.append(f"group size {self.group_size}")
        if self.kv_cache:
            parts.append(f"KV cache {self.kv_cache}")
        return ", ".join(parts) + f" ({self.source})"

    @property
    def kv_only(self) -> bool:
        """Only the KV cache is quantized (from_checkpoint's algorithm "none (KV cache only)")."""
        return self.algorithm.startswith("none")

    def needs(self) -> tuple[float, str] | None:
        """The compute capability its kernels need, with the GPUs that have it (None: any)."""
        return MIN_CAPABILITY.get(self.algorithm.upper())


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _text(value: Any) -> str | None:
    return str(value) if isinstance(value, str) and value else None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from None


def from_checkpoint(directory: Path) -> Quantization | None:
    """The quantization of a Hugging Face checkpoint directory (None: full precision); a
    ValueError names a file that cannot be read."""
    modelopt = directory / "hf_quant_config.json"
    if modelopt.is_file():
        data = _json(modelopt)
        section = data.get("quantization", data) if isinstance(data, dict) else {}
        algorithm = _text(section.get("quant_algo"))
        kv_cache = _text(section.get("kv_cache_quant_algo"))
        if algorithm or kv_cache:
            return Quantization(
                algorithm=algorithm or "none (KV cache only)",
                group_size=_int(section.get("group_size")),
                kv_cache=kv_cache,
                source="hf_quant_config.json",
            )
    config_path = directory / "config.json"
    if not config_path.is_file():
        return None
    config = _json(config_path)
    section = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(section, dict):
        return None
    method = _text(section.get("quant_method")) or "unknown"
    algorithm = _text(section.get("quant_algo"))  # modelopt's own
    if algorithm is None:
        bits = _int(section.get("bits")) or _int(section.get("w_bit"))
        algorithm = {"awq": "W4A16_AWQ", "gptq": "W4A16_GPTQ", "fp8": "FP8"}.get(method, method)
        if bits and method in ("awq", "gptq") and bits != 4:
            algorithm = f"W{bits}A16_{method.upper()}"
    return Quantization(
        algorithm=algorithm,
        group_size=_int(section.get("group_size")) or _int(section.get("q_group_size")),
        kv_cache=_text(section.get("kv_cache_quant_algo")) or _text(section.get("kv_cache_scheme")),
        source=f"config.json quantization_config ({method})",
    )


def from_engine_config(data: dict[str, Any]) -> Quantization | None:
    """The quantization a TensorRT-LLM engine was built with (its config.json, parsed)."""
    pretrained = data.get("pretrained_config")
    section = pretrained.get("quantization") if isinstance(pretrained, dict) else None
    if not isinstance(section, dict):
        return None
    algorithm = _text(section.get("quant_algo"))
    kv_cache = _text(section.get("kv_cache_quant_algo"))
    if algorithm is None and kv_cache is None:
        return None
    return Quantization(
        algorithm=algorithm or "none (KV cache only)",
        group_size=_int(section.get("group_size")) if algorithm else None,
        kv_cache=kv_cache,
        source="engine config.json",
    )


def cpu_refusal(quantization: Quantization) -> str | None:
    """Why the CPU stand-in cannot serve the quantization, None when it can: it dequantizes
    ModelOpt's unified checkpoints in the formats of CPU_FORMATS (cpu_engine/dequantize.py)."""
    modelopt = quantization.source == "hf_quant_config.json" or "(modelopt)" in quantization.source
    fp4 = "FP4" in quantization.algorithm.upper()
    if not modelopt:
        why = "it reads ModelOpt's unified checkpoints only (other tools pack weights otherwise)"
    elif fp4:
        why = (
            "ModelOpt's own NVFP4 fake quantization runs on CUDA only, so there is no reference "
            "to match the stand-in's reading against on a CPU"
        )
    elif quantization.algorithm.upper() not in CPU_FORMATS and not quantization.kv_only:
        why = f"it dequantizes {', '.join(CPU_FORMATS)} only"
    elif (quantization.kv_cache or "FP8").upper() != "FP8":
        why = "its KV cache is FP8 or full precision"
    else:
        return None
    return (
        f"the CPU stand-in does not serve {quantization.describe()}: {why}. Serve it with "
        "TensorRT-LLM (`pack_model.py --checkpoint DIR`, the LLM API workflow, for a GPU image), "
        "or quantize the full-precision model with `pack_model.py --quantize fp8|int4_awq|"
        "w4a8_awq` for the stand-in"
    )


def gpu_refusal(quantization: Quantization, gpu_type: str | None) -> str | None:
    """Why `gpu_type` (BentoCloud's name) cannot run the quantization, None when it can or the
    GPU is unknown."""
    needed = quantization.needs()
    capability = GPU_CAPABILITY.get((gpu_type or "").lower())
    if needed is None or capability is None or capability >= needed[0]:
        return None
    return (
        f"{quantization.algorithm} needs a GPU of compute capability {needed[0]} or newer "
        f"({needed[1]}); {gpu_type} has {capability}: pick such a GPU (--gpu-type, "
        "TRTLLM_GPU_TYPE) or a format it runs"
    )
