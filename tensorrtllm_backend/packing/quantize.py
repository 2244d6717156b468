"""Quantize a Hugging Face checkpoint with NVIDIA ModelOpt at pack time (pack_model.py
--quantize): calibrate on local text, export ModelOpt's unified checkpoint (weights +
hf_quant_config.json, what TensorRT-LLM's LLM API loads), and pack that like any pre-quantized
checkpoint. Nothing is downloaded: the calibration text is a local file or folder, or the small
text shipped with the project.

ModelOpt (`nvidia-modelopt`, import `modelopt`) is imported here only, and only when asked for:
packing without --quantize never needs it.
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .engine_packing import PackError

# --quantize: ModelOpt's configuration of each format (modelopt.torch.quantization), and the
# quant_algo its export records.
FORMATS: dict[str, tuple[str, str]] = {
    "fp8": ("FP8_DEFAULT_CFG", "FP8"),
    "int4_awq": ("INT4_AWQ_CFG", "W4A16_AWQ"),
    "nvfp4": ("NVFP4_DEFAULT_CFG", "NVFP4"),
    "w4a8_awq": ("W4A8_AWQ_BETA_CFG", "W4A8_AWQ"),
}
# --kv-cache-dtype: ModelOpt's KV-cache configuration, added to the format's.
KV_CACHE_FORMATS: dict[str, str] = {"fp8": "FP8_KV_CFG"}
# The calibration text shipped with the project (the demo tokenizer's corpus: 59 paragraphs).
DEFAULT_CALIBRATION = Path(__file__).with_name("corpus.txt")
DEFAULT_CALIB_SIZE = 64
CALIB_MAX_TOKENS = 512  # each sample's tokens at most
# INT4 AWQ blocks: a layer's input dimension must be a multiple of this.
AWQ_BLOCK = 128
INSTALL = (
    "pip install --no-deps nvidia-modelopt==0.47.0 && pip install nvidia-ml-py omegaconf pulp "
    "ninja rich scipy (or scripts/bootstrap.sh, which installs requirements-modelopt.txt)"
)
# What the export leaves out of a checkpoint and packing needs: every file but the weights.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")


def _samples_of(path: Path) -> list[str]:
    """A .txt file's paragraphs (blank-line separated), or a .jsonl file's `text` fields."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        samples = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise PackError(f"{path}:{number}: not JSON ({error.msg})") from None
            value = record.get("text") if isinstance(record, dict) else record
            if not isinstance(value, str):
                raise PackError(f"{path}:{number}: expected a string or an object with `text`")
            samples.append(value)
        return [s for s in samples if s.strip()]
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def calibration_texts(path: Path | None, size: int) -> list[str]:
    """Up to `size` calibration samples from `path`: a .txt or .jsonl file, or a folder of them
    (its files in name order); the shipped text when `path` is None."""
    if size < 1:
        raise PackError("--calib-size must be at least 1")
    source = path or DEFAULT_CALIBRATION
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.suffix in (".txt", ".jsonl"))
        if not files:
            raise PackError(f"--calib-data {source} holds no .txt or .jsonl files")
    elif source.is_file():
        files = [source]
    else:
        raise PackError(f"--calib-data {source} does not exist")
    samples: list[str] = []
    for file in files:
        samples.extend(_samples_of(file))
        if len(samples) >= size:
            break
    if not samples:
        raise PackError(f"--calib-data {source} holds no text")
    return samples[:size]


def _modelopt() -> tuple[Any, Callable[..., None]]:
    """modelopt.torch.quantization and export_hf_checkpoint, or a PackError saying how to
    install them."""
    try:
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint
    except ImportError as error:
        raise PackError(
            f"--quantize needs NVIDIA ModelOpt, which does not import here ({error}): {INSTALL}"
        ) from None
    return mtq, export_hf_checkpoint


def quantize_config(mtq: Any, fmt: str, kv_cache: str | None) -> dict[str, Any]:
    """ModelOpt's configuration for `fmt` (a --quantize choice), with the KV cache's added."""
    config = copy.deepcopy(getattr(mtq, FORMATS[fmt][0]))
    if kv_cache is not None:
        extra = getattr(mtq, KV_CACHE_FORMATS[kv_cache])["quant_cfg"]
        quant_cfg = config["quant_cfg"]
        # ModelOpt 0.47 lists its rules (later ones win); older releases keyed them by pattern.
        config["quant_cfg"] = (
            [*quant_cfg, *extra] if isinstance(quant_cfg, list) else {**quant_cfg, **extra}
        )
    return config


def _check_awq_shapes(model: Any, fmt: str) -> None:
    """INT4 AWQ quantizes each linear layer's input in blocks of 128: refuse, before a long
    calibration, a model with a narrower or ragged layer (the export would fail at the end)."""
    if "awq" not in fmt:
        return
    import torch

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
            if module.in_features % AWQ_BLOCK:
                raise PackError(
                    f"--quantize {fmt} quantizes in blocks of {AWQ_BLOCK} input features; "
                    f"{name} takes {module.in_features} (with --demo: --demo-size awq)"
                )


def load_for_calibration(checkpoint: Path) -> tuple[Any, Any]:
    """The checkpoint's causal LM (float32 on the CPU, its own dtype on a GPU) and tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    if "vision_config" in config:
        raise PackError(
            "--quantize takes a causal LM: quantize a vision-language model with ModelOpt's "
            "hf_ptq.py and pack its export with --checkpoint or --hf-model"
        )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "auto" if device == "cuda" else torch.float32  # bf16 matmuls are slow on a CPU
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(checkpoint), local_files_only=True, dtype=dtype
    ).to(device)
    return model.eval(), tokenizer


def calibrate(
    model: Any,
    tokenizer: Any,
    fmt: str,
    kv_cache: str | None,
    texts: list[str],
    show_progress: bool = True,
) -> Any:
    """`model` quantized by ModelOpt in `fmt` (fake-quantized, in place), calibrated on `texts`
    one sample at a time, a progress bar over them."""
    import torch
    from tqdm import tqdm

    mtq, _ = _modelopt()
    _check_awq_shapes(model, fmt)
    device = next(model.parameters()).device
    batches = [
        tokenizer(text, return_tensors="pt", truncation=True, max_length=CALIB_MAX_TOKENS)
        for text in texts
    ]

    def forward_loop(quantized: Any) -> None:
        # AWQ runs the loop more than once (its scale search, then calibration).
        with torch.no_grad():
            for batch in tqdm(
                batches, desc=f"calibrating ({fmt})", unit="sample", disable=not show_progress
            ):
                quantized(input_ids=batch["input_ids"].to(device))

    return mtq.quantize(model, quantize_config(mtq, fmt, kv_cache), forward_loop)


def export(model: Any, source: Path, out_dir: Path) -> Path:
    """Write the quantized `model` as ModelOpt's unified checkpoint in `out_dir`, with the
    tokenizer, chat template and other non-weight files of `source`. The export changes `model`
    (it packs its weights): it is of no use afterwards."""
    import torch

    _, export_hf_checkpoint = _modelopt()
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    stored = str(config.get("dtype") or config.get("torch_dtype") or "")
    # Layers left in full precision keep the checkpoint's 16-bit type (calibration on a CPU ran
    # in float32); None: the model's own.
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(stored)
    export_hf_checkpoint(model, dtype=dtype, export_dir=str(out_dir))
    for path in sorted(source.iterdir()):
        if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES):
            if not (out_dir / path.name).exists():
                shutil.copy2(path, out_dir / path.name)
    return out_dir


def quantize_checkpoint(
    checkpoint: Path,
    out_dir: Path,
    fmt: str,
    kv_cache: str | None = None,
    calib_data: Path | None = None,
    calib_size: int | None = None,
    show_progress: bool = True,
) -> Path:
    """pack_model.py --quantize: `checkpoint` (full precision) quantized to `fmt` with ModelOpt,
    calibrated on `calib_size` (None: DEFAULT_CALIB_SIZE) samples of `calib_data` (None: the
    shipped text), exported to `out_dir`. Returns out_dir."""
    from ..common.quantization import from_checkpoint

    if fmt not in FORMATS:
        raise PackError(f"--quantize {fmt}: choose one of {', '.join(FORMATS)}")
    try:
        already = from_checkpoint(checkpoint)
    except ValueError as error:
        raise PackError(str(error)) from None
    if already is not None:
        raise PackError(
            f"{checkpoint} is quantized already ({already.describe()}): pack it without --quantize"
        )
    texts = calibration_texts(calib_data, DEFAULT_CALIB_SIZE if calib_size is None else calib_size)
    _modelopt()  # before loading the model: a missing install is said at once
    started = time.monotonic()
    model, tokenizer = load_for_calibration(checkpoint)
    calibrate(model, tokenizer, fmt, kv_cache, texts, show_progress)
    export(model, checkpoint, out_dir)
    print(
        f"quantized:    {fmt}{f' (KV cache {kv_cache})' if kv_cache else ''} with ModelOpt on "
        f"{len(texts)} calibration samples in {time.monotonic() - started:.1f} s"
    )
    return out_dir
