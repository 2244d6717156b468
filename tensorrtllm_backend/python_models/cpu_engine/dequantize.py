"""A ModelOpt unified checkpoint (`hf_quant_config.json`, or config.json's `quantization_config`
with `quant_method: modelopt`), read back for the CPU stand-in: each quantized linear layer's
weight dequantized from its stored tensors, and its input quantized as ModelOpt's fake-quantized
model quantizes it, so the stand-in answers what the quantized model answers. transformers alone
would read the packed or scaled weights as plain floats and answer wrong text, silently.

The stored formats, as ModelOpt 0.47 writes them (modelopt/torch/export/quant_utils.py,
`to_quantized_weight`, `pack_int4_in_uint8`; unified_export_hf.py, `_export_quantized_weight`):
- FP8: `weight` float8_e4m3fn, `weight_scale` float32 per tensor (or per output channel):
  W = weight * weight_scale. `input_scale` (per tensor): x -> e4m3(x / s) * s.
- W4A16_AWQ: `weight` uint8 [out / 2, in], two signed int4 (two's complement, -8..7) per byte
  along the OUTPUT dimension (row 2i in the low nibble, 2i + 1 in the high one); `weight_scale`
  float32 [out, in / group]: W = int4 * weight_scale of its group. `pre_quant_scale` [in] where
  the export could not fold AWQ's smoothing into the layer norm before: x -> x * pre_quant_scale.
- W4A8_AWQ: W4A16_AWQ's tensors, the weight then on the FP8 grid of `weight_scale_2`, and the
  smoothed input in FP8 (`input_scale`).
- KV cache FP8 (`kv_cache_quant_algo`): `k_proj.k_scale`, `v_proj.v_scale` (amax / 448): the
  attention's keys and values (after RoPE) on the FP8 grid of those scales, as the cache stores
  them (`KvCacheQuantizer`, applied by the stand-in's attention function).
NVFP4 (FP4 weights in 16-element blocks, FP8 block scales, dynamically quantized FP4 inputs) is
refused: ModelOpt's own fake quantization of its inputs runs on CUDA only, so there is no
reference on a CPU to prove a reading of it against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...common.quantization import Quantization, cpu_refusal, from_checkpoint

FP8_MAX = 448.0  # the largest float8_e4m3fn
# A quantized linear layer's tensors in the checkpoint, beside its module name.
_LAYER_TENSORS = ("weight", "weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale")


class QuantizedCheckpointError(ValueError):
    """A quantized checkpoint the stand-in cannot read back exactly."""


def checkpoint_quantization(checkpoint_dir: str | Path) -> Quantization | None:
    """The quantization of the checkpoint (None: full precision), refused with the reason
    when the stand-in cannot read it back (common/quantization.py's cpu_refusal)."""
    try:
        quantization = from_checkpoint(Path(checkpoint_dir))
    except ValueError as error:
        raise QuantizedCheckpointError(str(error)) from None
    if quantization is not None and (refusal := cpu_refusal(quantization)) is not None:
        raise QuantizedCheckpointError(refusal)
    return quantization


def _float8(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """On the FP8 grid of `scale` (ModelOpt's fake quantization: x / s, clamped, to e4m3)."""
    scaled = (weight.float() / scale).clamp(-FP8_MAX, FP8_MAX)
    return scaled.to(torch.float8_e4m3fn).float() * scale


def _unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """[out / 2, in] uint8 -> [out, in] int4 values: row 2i from the low nibbles, 2i + 1 from the
    high ones (pack_int4_in_uint8's order), sign-extended."""
    low = (packed & 0x0F).to(torch.int8)
    high = (packed >> 4).to(torch.int8)
    values = torch.stack((low, high), dim=1).reshape(-1, packed.shape[1])
    return torch.where(values >= 8, values - 16, values)


def dequantize_weight(algorithm: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """One linear layer's float32 weight from its stored `weight`, `weight_scale` (and
    `weight_scale_2`) under `algorithm`."""
    weight, scale = tensors["weight"], tensors["weight_scale"].float()
    if algorithm == "FP8":
        if weight.dtype != torch.float8_e4m3fn:
            raise QuantizedCheckpointError(f"an FP8 weight stored as {weight.dtype}")
        if scale.numel() == 1:
            return weight.float() * scale.reshape(())
        if scale.numel() == weight.shape[0]:  # per output channel
            return weight.float() * scale.reshape(-1, 1)
        raise QuantizedCheckpointError(
            f"FP8 weight scale of shape {tuple(scale.shape)} for a weight of "
            f"{tuple(weight.shape)}: only per-tensor and per-channel scales are read"
        )
    # W4A16_AWQ, W4A8_AWQ: int4 in groups along the input dimension.
    if weight.dtype != torch.uint8:
        raise QuantizedCheckpointError(f"an INT4 AWQ weight stored as {weight.dtype}")
    values = _unpack_int4(weight)
    out, width = values.shape
    if scale.dim() != 2 or scale.shape[0] != out or width % scale.shape[1]:
        raise QuantizedCheckpointError(
            f"INT4 weight scale of shape {tuple(scale.shape)} for a weight of {out} x {width}"
        )
    group = width // scale.shape[1]
    dequantized = values.float() * scale.repeat_interleave(group, dim=1)
    if algorithm == "W4A8_AWQ":
        if "weight_scale_2" not in tensors:
            raise QuantizedCheckpointError("a W4A8 AWQ weight without its weight_scale_2")
        dequantized = _float8(dequantized, tensors["weight_scale_2"].float())
    return dequantized


class _InputQuantizer(torch.nn.Module):
    """What ModelOpt's input quantizer does to a linear layer's input: AWQ's smoothing
    (`pre_quant_scale`), then FP8 on a fixed scale (`input_scale`), either optional."""

    def __init__(self, pre_quant_scale: torch.Tensor | None, input_scale: torch.Tensor | None):
        super().__init__()
        self.register_buffer("pre_quant_scale", pre_quant_scale)
        self.register_buffer("input_scale", input_scale)

    def forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]
        if self.pre_quant_scale is not None:
            x = x.float() * self.pre_quant_scale
        if self.input_scale is not None:
            x = _float8(x, self.input_scale)
        return (x.to(args[0].dtype), *args[1:])


class KvCacheQuantizer(torch.nn.Module):
    """An attention layer's FP8 KV cache: its keys and values on the FP8 grids of `k_scale` and
    `v_scale`, as ModelOpt's k/v_bmm_quantizers put them (the stand-in's attention function
    calls it as `module.trtllm_kv_cache`)."""

    def __init__(self, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("k_scale", k_scale)
        self.register_buffer("v_scale", v_scale)

    def forward(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            _float8(key, self.k_scale).to(key.dtype),
            _float8(value, self.v_scale).to(value.dtype),
        )


def dequantize_state_dict(
    tensors: dict[str, torch.Tensor], quantization: Quantization
) -> tuple[dict[str, torch.Tensor], dict[str, torch.nn.Module]]:
    """The checkpoint's `tensors` with every quantized weight in float32 and the scales taken
    out; with, by module name, what quantizes at run time: each quantized layer's input
    quantizer (none for a weight-only format whose smoothing the export folded away) and each
    attention layer's KV-cache quantizer."""
    algorithm = quantization.algorithm.upper()
    modules = sorted(
        key.removesuffix(".weight_scale") for key in tensors if key.endswith(".weight_scale")
    )
    if not modules and not quantization.kv_only:
        raise QuantizedCheckpointError(
            f"{quantization.source} says {quantization.algorithm}, but no layer has a "
            "weight_scale: the weights are not what it says"
        )
    out = dict(tensors)
    quantizers: dict[str, torch.nn.Module] = {}
    for name in modules:
        parts = {
            part: out.pop(f"{name}.{part}") for part in _LAYER_TENSORS if f"{name}.{part}" in out
        }
        out[f"{name}.weight"] = dequantize_weight(algorithm, parts)
        pre_quant_scale = parts.get("pre_quant_scale")
        input_scale = parts.get("input_scale")
        if pre_quant_scale is not None or input_scale is not None:
            quantizers[name] = _InputQuantizer(
                None if pre_quant_scale is None else pre_quant_scale.float(),
                None if input_scale is None else input_scale.float().reshape(()),
            )
    kv_cache = (quantization.kv_cache or "").upper()
    for key in [k for k in out if k.endswith(".k_proj.k_scale")]:
        attention = key.removesuffix(".k_proj.k_scale")
        k_scale = out.pop(key).float().reshape(())
        v_scale = out.pop(f"{attention}.v_proj.v_scale").float().reshape(())
        if kv_cache != "FP8":
            raise QuantizedCheckpointError(
                f"a {kv_cache or 'unnamed'} KV cache: the CPU stand-in reads an FP8 one"
            )
        quantizers[attention] = KvCacheQuantizer(k_scale, v_scale)
    return out, quantizers


def read_tensors(checkpoint_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's safetensors files (shards included)."""
    from safetensors.torch import load_file

    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    if not files:
        raise QuantizedCheckpointError(f"{checkpoint_dir} has no .safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def load_dequantized(
    auto: Any, checkpoint_dir: str | Path, quantization: Quantization, dtype: torch.dtype
) -> Any:
    """The transformers model (`auto`: its Auto class) of a ModelOpt checkpoint, its weights
    dequantized, its quantized layers' inputs quantized (forward pre-hooks) and its attention
    layers' KV-cache quantizers set (`trtllm_kv_cache`, which the stand-in's attention calls)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(checkpoint_dir), local_files_only=True)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights handed over are plain floats
    # The class the checkpoint names (an Auto class loads from a directory, not a state dict).
    architecture = (getattr(config, "architectures", None) or [""])[0]
    model_class = getattr(transformers, architecture, None) or auto._model_mapping[type(config)]
    tensors, quantizers = dequantize_state_dict(read_tensors(checkpoint_dir), quantization)
    model = model_class.from_pretrained(None, config=config, state_dict=tensors, dtype=dtype)
    modules = dict(model.named_modules())
    for name, quantizer in quantizers.items():
        module = modules.get(name)
        if module is None:
            raise QuantizedCheckpointError(
                f"the checkpoint quantizes {name}, which the model lacks"
            )
        if isinstance(quantizer, KvCacheQuantizer):
            module.trtllm_kv_cache = quantizer  # a submodule: moves with the model
        else:
            module.trtllm_input_quantizer = quantizer
            module.register_forward_pre_hook(quantizer)
    return model
