"""ModelOpt's own fake-quantized demo model: the reference a quantized checkpoint served by the
CPU stand-in is held to (unit and integration tests).

The demo checkpoint is quantized in the test as `pack_model.py --quantize` quantizes it (the same
calibration, the same code: tensorrtllm_backend/packing/quantize.py), and its greedy tokens are
computed on the fake-quantized model in memory, where every quantizer still quantizes in float.
One step of ModelOpt's export changes that model first, in place, before it packs the weights:
`requantize_resmooth_fused_llm_layers` gives the layers that share an input (q/k/v, gate/up)
one AWQ smoothing (their average, what TensorRT-LLM's fused GEMMs need), recalibrating their
weights' scales, and folds it into the layer norm before them. For FP8 it changes nothing; for
INT4 AWQ it is a different model from the one `mtq.quantize` returned. The reference runs that
step on a copy: the fake-quantized model the exported checkpoint holds.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, NamedTuple

# 16 prompts, none alike (their greedy continuations differ on the random demo model).
PROMPTS = [
    "The lighthouse keeper woke before dawn",
    "Hello",
    "Serving a model to many users at once is a problem of scheduling, and",
    "In the village below, the baker",
    "Once upon a time",
    "The sea was grey and patient.",
    "A fishing boat moved slowly",
    "Flour covered her hands",
    "The first customers would arrive at six:",
    "Le café était presque vide.",
    "Numbers: 1, 2, 3,",
    "She shaped the loaves one by one",
    "The wind carried",
    "Why does the lens need cleaning?",
    "def main():",
    "Thirty years",
]
NEW_TOKENS = 12
CALIB_SIZE = 8  # samples of the shipped calibration text: seconds, not minutes, per format


def greedy(model: Any, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """Greedy tokens of each prompt (token ids), each step a full forward (no KV cache): the
    plainest reading of the model, end tokens included."""
    import torch

    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            for _ in range(new_tokens):
                token = model(input_ids=ids).logits[0, -1].argmax()
                ids = torch.cat([ids, token.view(1, 1)], dim=1)
            outputs.append(ids[0, len(prompt) :].tolist())
    return outputs


def prompt_ids(tokenizer: Any) -> list[list[int]]:
    return [tokenizer(text)["input_ids"] for text in PROMPTS]


class QuantizedDemo(NamedTuple):
    checkpoint: Path  # the exported unified checkpoint (tokenizer files included)
    reference: list[list[int]]  # greedy tokens of ModelOpt's fake-quantized model, as exported
    before_export: list[list[int]] | None  # those of the model mtq.quantize returned (if asked)


def quantized_demo(
    out_dir: Path,
    fmt: str,
    kv_cache: str | None = None,
    size: str = "tiny",
    before_export: bool = False,
) -> QuantizedDemo:
    """The demo checkpoint of `size` quantized to `fmt` (a --quantize choice) as pack_model.py
    --calib-size CALIB_SIZE does it, exported to out_dir / "quantized"; with the fake-quantized
    model's greedy tokens for PROMPTS (see the module's docstring)."""
    from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers

    from tensorrtllm_backend.packing.demo import build_demo_checkpoint
    from tensorrtllm_backend.packing.quantize import (
        calibrate,
        calibration_texts,
        export,
        load_for_calibration,
    )

    checkpoint = build_demo_checkpoint(out_dir / "demo", size=size)
    model, tokenizer = load_for_calibration(checkpoint)
    texts = calibration_texts(None, CALIB_SIZE)
    calibrate(model, tokenizer, fmt, kv_cache, texts, show_progress=False)
    prompts = prompt_ids(tokenizer)
    as_quantized = greedy(model, prompts) if before_export else None
    reference = copy.deepcopy(model)
    requantize_resmooth_fused_llm_layers(reference)
    tokens = greedy(reference, prompts)
    return QuantizedDemo(export(model, checkpoint, out_dir / "quantized"), tokens, as_quantized)
