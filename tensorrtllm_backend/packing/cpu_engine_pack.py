"""The CPU stand-in engine pack_model.py packs (--demo, --demo-vlm, --hf-model, --synthetic,
--scripted): its engine directory, built at pack time, and the tokenizer that goes with it."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from ..common.cpu_engine_config import write_engine_dir
from ..common.quantization import cpu_refusal, from_checkpoint
from ..common.tokenization import load_tokenizer
from .checkpoint import language_config
from .engine_packing import TOKENIZER_FILES, PackError

# The CPU engine's limits unless pack_model.py is given others.
CPU_LIMITS = {"max_batch_size": 64, "max_input_len": 1024, "max_seq_len": 2048}


def _check_stand_in_reads(checkpoint: Path) -> None:
    """A quantized checkpoint the stand-in cannot dequantize (cpu_engine/dequantize.py) is
    refused before it is stored: transformers would read its packed or scaled weights as plain
    floats, and every answer would be wrong."""
    try:
        quantization = from_checkpoint(checkpoint)
    except ValueError as error:
        raise PackError(str(error)) from None
    if quantization is None:
        return
    refusal = cpu_refusal(quantization)
    if refusal is None and not quantization.kv_only and not _has_weight_scales(checkpoint):
        refusal = (
            f"{quantization.source} says {quantization.algorithm}, but no layer has a "
            "weight_scale: the weights are not what it says"
        )
    if refusal is not None:
        raise PackError(f"{checkpoint}: {refusal}")


def _has_weight_scales(checkpoint: Path) -> bool:
    """Whether a layer of the checkpoint's safetensors has a weight_scale (headers only)."""
    from safetensors import safe_open

    for file in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(file), "numpy") as reader:
            if any(key.endswith(".weight_scale") for key in reader.keys()):
                return True
    return False


def build_cpu_engine(args: argparse.Namespace, scratch: Path) -> tuple[Path, Path, str]:
    """Build the CPU engine dir in `scratch` for pack_model.py's --demo, --demo-vlm, --hf-model,
    --synthetic or --scripted (its parsed `args`): (engine dir, tokenizer dir, source). The demo
    VLM's source is "demo" too: a demo model, whose manifest records that it takes images."""

    limits = {
        key: getattr(args, key) if getattr(args, key) is not None else default
        for key, default in CPU_LIMITS.items()
    }
    if limits["max_seq_len"] <= limits["max_input_len"]:
        raise PackError("--max-seq-len must be larger than --max-input-len")
    if args.demo:
        from .demo import build_demo_checkpoint

        checkpoint = build_demo_checkpoint(scratch / "demo-checkpoint", size=args.demo_size)
        source = "demo"
    elif args.demo_vlm:
        from .demo import build_demo_vlm_family

        family = getattr(args, "demo_vlm_family", "llava")
        checkpoint = build_demo_vlm_family(scratch / "demo-vlm-checkpoint", family)
        source = "demo"
    elif args.hf_model is not None:
        checkpoint = args.hf_model
        if not checkpoint.is_dir():
            raise PackError(f"--hf-model {checkpoint} is not a directory")
        if not (checkpoint / "config.json").is_file():
            raise PackError(f"--hf-model {checkpoint} has no config.json: not a HF checkpoint")
        source = "hf"
    else:
        checkpoint = None
        source = "scripted" if args.scripted else "synthetic"
    if checkpoint is not None and getattr(args, "quantize", None):
        from .quantize import quantize_checkpoint

        checkpoint = quantize_checkpoint(
            checkpoint, scratch / "quantized", args.quantize, args.kv_cache_dtype,
            args.calib_data, args.calib_size, show_progress=not args.no_progress,
        )  # fmt: skip
    if checkpoint is not None:
        _check_stand_in_reads(checkpoint)
    tokenizer_dir = args.tokenizer_dir or checkpoint
    if tokenizer_dir is None:
        # The synthetic engine emits ids only; the demo tokenizer turns them into text.
        from .demo import build_demo_checkpoint

        tokenizer_dir = build_demo_checkpoint(scratch / "demo-checkpoint")
    if not Path(tokenizer_dir).is_dir():
        raise PackError(f"tokenizer directory {tokenizer_dir} does not exist")
    try:
        tokenizer = load_tokenizer(tokenizer_dir)
    except Exception as error:
        raise PackError(f"cannot load the tokenizer in {tokenizer_dir}: {error}") from error
    engine_dir = scratch / "engine"
    if checkpoint is not None:
        config = json.loads((checkpoint / "config.json").read_text())
        write_engine_dir(
            engine_dir, mode="hf", checkpoint_dir=checkpoint,
            vocab_size=int(language_config(config).get("vocab_size") or len(tokenizer)),
            eos_token_id=int(tokenizer.eos_token_id),
            architecture=(config.get("architectures") or ["CausalLM"])[0],
            device=args.device, tokens_per_block=args.tokens_per_block, **limits,
        )  # fmt: skip
    elif source == "scripted":
        # The scripted engine reads and writes text with the tokenizer alone: no weights.
        scripted = scratch / "scripted-tokenizer"
        scripted.mkdir()
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_dir) / name).is_file():
                shutil.copy(Path(tokenizer_dir) / name, scripted / name)
        write_engine_dir(
            engine_dir, mode="scripted", checkpoint_dir=scripted, vocab_size=len(tokenizer),
            eos_token_id=int(tokenizer.eos_token_id), ttft_ms=args.ttft_ms, itl_ms=args.itl_ms,
            **limits,
        )  # fmt: skip
    else:
        write_engine_dir(
            engine_dir, mode="synthetic", vocab_size=len(tokenizer),
            eos_token_id=int(tokenizer.eos_token_id), ttft_ms=args.ttft_ms, itl_ms=args.itl_ms,
            **limits,
        )  # fmt: skip
    return engine_dir, Path(tokenizer_dir), source
