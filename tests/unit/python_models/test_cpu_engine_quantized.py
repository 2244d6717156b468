"""The CPU stand-in serves ModelOpt's quantized checkpoints for real: FP8 (with and without an
FP8 KV cache), INT4 AWQ and W4A8 AWQ weights are dequantized from the exported tensors at load
(cpu_engine/dequantize.py), and the stand-in's greedy tokens for 16 prompts, all in one batch,
equal those of ModelOpt's own fake-quantized model (tests/quantized_reference.py). Formats it
cannot read are refused at load with the reason."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cpu_engine_helpers import make_request, run_to_end

torch = pytest.importorskip("torch")

from tensorrtllm_backend.python_models.cpu_engine.dequantize import (  # noqa: E402
    QuantizedCheckpointError,
    _unpack_int4,
    dequantize_weight,
)
from tensorrtllm_backend.python_models.cpu_engine.hf import HFBackend  # noqa: E402
from tensorrtllm_backend.python_models.cpu_engine.scheduler import Scheduler  # noqa: E402
from tests.quantized_reference import NEW_TOKENS, QuantizedDemo, quantized_demo  # noqa: E402

# --quantize, --kv-cache-dtype, --demo-size: AWQ's 128-wide blocks need the awq size.
FORMATS = {
    "fp8": ("fp8", None, "tiny"),
    "fp8-kv-fp8": ("fp8", "fp8", "tiny"),
    "int4_awq": ("int4_awq", None, "awq"),
    "w4a8_awq": ("w4a8_awq", None, "awq"),
}


@pytest.fixture(scope="module", params=list(FORMATS))
def quantized(request: pytest.FixtureRequest, tmp_path_factory) -> QuantizedDemo:
    fmt, kv_cache, size = FORMATS[request.param]
    out = tmp_path_factory.mktemp(request.param)
    return quantized_demo(out, fmt, kv_cache, size, before_export=request.param == "fp8")


def serve_greedy(backend: HFBackend, prompts: list[list[int]]) -> list[list[int]]:
    """The stand-in's greedy tokens, every prompt in one in-flight batch."""
    scheduler = Scheduler(backend, max_batch_size=len(prompts))
    scheduler.start()
    try:
        return run_to_end(scheduler, [make_request(p, NEW_TOKENS) for p in prompts])
    finally:
        scheduler.stop()


def prompts_of(checkpoint: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    from tests.quantized_reference import prompt_ids

    return prompt_ids(AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True))


def test_greedy_tokens_equal_modelopts_fake_quantized_model(quantized: QuantizedDemo) -> None:
    prompts = prompts_of(quantized.checkpoint)
    backend = HFBackend(quantized.checkpoint, num_threads=1, device="cpu")
    assert serve_greedy(backend, prompts) == quantized.reference
    # The check tells formats apart: the full-precision demo answers otherwise.
    plain = HFBackend(quantized.checkpoint.parent / "demo", num_threads=1, device="cpu")
    assert serve_greedy(plain, prompts) != quantized.reference


@pytest.mark.parametrize("quantized", ["fp8"], indirect=True)
def test_fp8_needs_its_input_quantization_too(quantized: QuantizedDemo) -> None:
    """What decided that the stand-in quantizes FP8 layers' inputs (input_scale): with the
    weights alone dequantized, the demo's greedy tokens are another model's."""
    # mtq.quantize's model itself: the export's resmoothing changes nothing in FP8.
    assert quantized.before_export == quantized.reference
    backend = HFBackend(quantized.checkpoint, num_threads=1, device="cpu")
    for module in backend.model.modules():
        if hasattr(module, "trtllm_input_quantizer"):
            module._forward_pre_hooks.clear()
    assert serve_greedy(backend, prompts_of(quantized.checkpoint)) != quantized.reference


def test_int4_unpacking_inverts_modelopts_packing() -> None:
    """ModelOpt's pack_int4_in_uint8 (two output rows per byte), read back by the stand-in."""
    from modelopt.torch.export.quant_utils import pack_int4_in_uint8

    torch.manual_seed(0)
    weight = torch.randn(8, 256)
    scale = weight.abs().reshape(8, 2, 128).amax(-1) / 7  # per 128-block, as INT4 AWQ's
    packed = pack_int4_in_uint8(weight, scale, 128)
    assert packed.dtype == torch.uint8 and packed.shape == (4, 256)
    expected = (weight / scale.repeat_interleave(128, dim=1)).round().clamp(-8, 7)
    assert torch.equal(_unpack_int4(packed).float(), expected)
    got = dequantize_weight("W4A16_AWQ", {"weight": packed, "weight_scale": scale})
    assert torch.equal(got, expected * scale.repeat_interleave(128, dim=1))


def test_fp8_dequantization_is_modelopts() -> None:
    from modelopt.torch.export.quant_utils import from_quantized_weight, to_quantized_weight

    torch.manual_seed(0)
    weight = torch.randn(16, 32)
    scale = weight.abs().max() / 448
    stored = to_quantized_weight(weight, scale, "fp8")
    assert stored.dtype == torch.float8_e4m3fn
    got = dequantize_weight("FP8", {"weight": stored, "weight_scale": scale})
    assert torch.equal(got, from_quantized_weight(stored, scale, "fp8", torch.float32))


def _with_quant_config(checkpoint: Path, tmp_path: Path, **quantization: object) -> Path:
    copied = shutil.copytree(checkpoint, tmp_path / "checkpoint")
    (copied / "hf_quant_config.json").write_text(json.dumps({"quantization": quantization}))
    return copied


def test_nvfp4_is_refused_with_the_reason(demo_checkpoint: Path, tmp_path: Path) -> None:
    checkpoint = _with_quant_config(demo_checkpoint, tmp_path, quant_algo="NVFP4", group_size=16)
    with pytest.raises(QuantizedCheckpointError, match="NVFP4 fake quantization runs on CUDA"):
        HFBackend(checkpoint, num_threads=1, device="cpu")


def test_another_tools_quantization_is_refused(demo_checkpoint: Path, tmp_path: Path) -> None:
    checkpoint = shutil.copytree(demo_checkpoint, tmp_path / "awq")
    config = json.loads((checkpoint / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128}
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(QuantizedCheckpointError, match="ModelOpt's unified checkpoints only"):
        HFBackend(checkpoint, num_threads=1, device="cpu")


def test_a_config_that_lies_about_its_weights_is_refused(
    demo_checkpoint: Path, tmp_path: Path
) -> None:
    """hf_quant_config.json says FP8 over full-precision weights: nothing to dequantize."""
    checkpoint = _with_quant_config(demo_checkpoint, tmp_path, quant_algo="FP8")
    with pytest.raises(QuantizedCheckpointError, match="no layer has a weight_scale"):
        HFBackend(checkpoint, num_threads=1, device="cpu")


@pytest.mark.parametrize("quantized", ["fp8-kv-fp8"], indirect=True)
def test_an_fp8_kv_cache_is_quantized_too(quantized: QuantizedDemo) -> None:
    """Keys and values on the FP8 grids of k_scale / v_scale, as ModelOpt's k/v_bmm_quantizers
    put them: left in float, the demo's greedy tokens are another model's."""
    backend = HFBackend(quantized.checkpoint, num_threads=1, device="cpu")
    attention = [m for m in backend.model.modules() if hasattr(m, "trtllm_kv_cache")]
    assert len(attention) == 2  # the demo's two layers
    for module in attention:
        del module.trtllm_kv_cache
    assert serve_greedy(backend, prompts_of(quantized.checkpoint)) != quantized.reference
