#!/usr/bin/env python3
"""Pack TensorRT-LLM engines or a Hugging Face checkpoint (or a CPU stand-in) + tokenizer + a
filled Triton model repository into the BentoML model store.

Two workflows (--workflow; by default the one of what is packed: llmapi for --checkpoint or LLM
API options, engine otherwise):
  engine  trtllm-build engines, served by the `tensorrtllm` C++ backend (inflight_batcher_llm)
  llmapi  a Hugging Face checkpoint, served by TensorRT-LLM's LLM API (PyTorch backend, >= 1.0)
          through our `llmapi` python model (or NVIDIA's, --llmapi-model nvidia); no engine build

Examples:
  python pack_model.py --engine-dir ./engines/llama3-8b --tokenizer-dir ./Meta-Llama-3-8B-Instruct
  python pack_model.py --checkpoint ./Meta-Llama-3-8B-Instruct --tp 2    # the llmapi workflow
  python pack_model.py --demo                       # tiny local Llama on the CPU engine
  python pack_model.py --demo --workflow llmapi     # the same checkpoint, llmapi model on CPU
  python pack_model.py --demo-vlm                   # tiny local LLaVA (images in), CPU engine
  python pack_model.py --demo-vlm --workflow llmapi # the same VLM, llmapi model on CPU
  python pack_model.py --demo-vlm --demo-vlm-family qwen2-vl   # tiny local Qwen2-VL instead
  python pack_model.py --synthetic --workflow llmapi --itl-ms 5   # llmapi model, synthetic tokens
  python pack_model.py --hf-model ./my-checkpoint   # any local HF causal LM or VLM, CPU engine
  python pack_model.py --synthetic --itl-ms 20      # deterministic tokens, for load tests
  python pack_model.py --checkpoint ./Llama-3.1-8B-Instruct --quantize fp8 --kv-cache-dtype fp8
                                                    # ModelOpt FP8 at pack time, for the LLM API
  python pack_model.py --demo --demo-size awq --quantize int4_awq   # INT4 AWQ on the CPU stand-in
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tensorrtllm_backend.common.engine_config import (
    EngineConfigError,
    check_runtime_compatibility,
    runtime_version_for_image,
)
from tensorrtllm_backend.common.quantization import Quantization, gpu_refusal
from tensorrtllm_backend.packing.checkpoint import describe_vision
from tensorrtllm_backend.packing.cpu_engine_pack import CPU_LIMITS, build_cpu_engine
from tensorrtllm_backend.packing.engine_packing import (
    TOKENIZER_FILES,
    PackError,
    PackPlan,
    StorablePlan,
    plan,
    staging_dir,
    store,
)
from tensorrtllm_backend.settings import load_settings

DEFAULT_NAMES = {
    "demo": "trtllm-demo", "demo-vlm": "trtllm-demo-vlm", "synthetic": "trtllm-synthetic",
    "scripted": "trtllm-scripted", "demo-qwen2-vl": "trtllm-demo-qwen2-vl",
    "demo-qwen2.5-vl": "trtllm-demo-qwen2.5-vl",
}  # fmt: skip
LLMAPI_DEMO_NAMES = {
    "demo": "trtllm-llmapi-demo", "demo-vlm": "trtllm-llmapi-demo-vlm",
    "synthetic": "trtllm-llmapi-synthetic", "demo-qwen2-vl": "trtllm-llmapi-demo-qwen2-vl",
    "demo-qwen2.5-vl": "trtllm-llmapi-demo-qwen2.5-vl",
}  # fmt: skip


def _parse_pairs(items: list[str], flag: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PackError(f"{flag} expects KEY=VALUE, got {item!r}")
        pairs[key.strip()] = value
    return pairs


def _bentofile_image() -> str:
    """docker.base_image of the bentofile.yaml beside this script, if any."""
    import yaml

    try:
        config = yaml.safe_load((Path(__file__).with_name("bentofile.yaml")).read_text())
        return str(config["docker"]["base_image"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return ""


def _default_image() -> str:
    return load_settings().base_image or _bentofile_image()


def _warn(message: str) -> None:
    print(f"pack_model: warning: {message}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--engine-dir", type=Path, help="trtllm-build output (config.json, rank*.engine)"
    )
    source.add_argument(
        "--hf-model",
        type=Path,
        help="local Hugging Face checkpoint for the CPU engine (a causal LM, or an "
        "image-text-to-text model with its processor)",
    )
    source.add_argument(
        "--checkpoint",
        type=Path,
        help="llmapi workflow: Hugging Face checkpoint (config.json, *.safetensors, tokenizer; "
        "a vision-language model's processor files)",
    )
    source.add_argument("--demo", action="store_true", help="generate and pack the tiny demo model")
    source.add_argument(
        "--demo-vlm",
        action="store_true",
        help="generate and pack the tiny demo vision-language model (LLaVA: images in)",
    )
    source.add_argument("--synthetic", action="store_true", help="synthetic CPU engine (no torch)")
    source.add_argument(
        "--scripted",
        action="store_true",
        help="scripted CPU engine: plays tool calls a user turn asks for (CALL <tool> <json>) "
        "and quotes tool results, through the demo chat template (tests of agent clients)",
    )

    parser.add_argument(
        "--tokenizer-dir", type=Path, help="tokenizer (default: the checkpoint's own)"
    )
    parser.add_argument("--name", help="model name in the store (default: by source)")
    parser.add_argument("--tag", help="model version (default: generated)")
    parser.add_argument("--dry-run", action="store_true", help="validate and show, store nothing")
    parser.add_argument(
        "--gpu-type",
        help="the GPU the model is packed for, by BentoCloud's name (nvidia-l4, nvidia-h100-80gb, "
        "nvidia-b200...): a quantized model whose format it cannot run is refused "
        "(default: TRTLLM_GPU_TYPE)",
    )
    parser.add_argument(
        "--workflow",
        choices=["engine", "llmapi"],
        help="engine: trtllm-build engines (or the CPU engine); llmapi: a checkpoint served by "
        "the LLM API (default: llmapi for --checkpoint or LLM API options, engine otherwise)",
    )
    parser.add_argument(
        "--route",
        choices=["direct", "ensemble", "bls"],
        help="engine workflow: default way through Triton for the service (default: direct)",
    )
    parser.add_argument(
        "--target-image",
        help="tritonserver image the engines will run on: a TensorRT-LLM version mismatch is "
        "an error (default: $TRTLLM_BASE_IMAGE or bentofile.yaml's docker.base_image, where a "
        "mismatch is only a warning)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a LoRA adapter, repeatable; requests select it by name. Engines: TensorRT-LLM's "
        "converted format (model.lora_weights.npy, model.lora_config.npy); --workflow llmapi: "
        "a Hugging Face adapter (adapter_config.json, adapter_model.safetensors)",
    )

    cpu = parser.add_argument_group(
        "CPU engine (--hf-model, --demo, --demo-vlm, --synthetic); the limits also for "
        "--workflow llmapi"
    )
    cpu.add_argument("--ttft-ms", type=float, default=0.0, help="synthetic: first-token delay")
    cpu.add_argument("--itl-ms", type=float, default=0.0, help="synthetic: inter-token latency")
    cpu.add_argument("--max-batch-size", type=int, help="default: 64 (llmapi: LLM API's)")
    cpu.add_argument("--max-input-len", type=int, help="default: 1024 (llmapi: max-seq-len - 1)")
    cpu.add_argument(
        "--max-seq-len", type=int, help="default: 2048 (llmapi: max_position_embeddings)"
    )
    cpu.add_argument(
        "--tokens-per-block",
        type=int,
        default=32,
        help="tokens per KV-cache block of the prefix cache (--enable-kv-cache-reuse true; "
        "TensorRT-LLM's name and default)",
    )
    cpu.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="--demo/--demo-vlm/--hf-model: where the transformers model runs at serve time "
        "(auto: CUDA when a GPU is present). The stand-in on a GPU, not TensorRT-LLM.",
    )
    cpu.add_argument(
        "--demo-size",
        choices=["tiny", "awq", "1b"],
        default="tiny",
        help="--demo: random-weight Llama size (awq: hidden 128, MLP 256, layers INT4 AWQ's "
        "128-wide blocks fit, for --quantize int4_awq/w4a8_awq; 1b: a 1B Llama's layer shapes, "
        "~2 GB in bf16)",
    )
    cpu.add_argument(
        "--demo-vlm-family",
        choices=["llava", "qwen2-vl", "qwen2.5-vl"],
        default="llava",
        help="--demo-vlm: which tiny VLM (llava: a CLIP tower before the demo Llama; qwen2-vl, "
        "qwen2.5-vl: image tokens by the image's size, 3-D rotary positions)",
    )

    quantize = parser.add_argument_group(
        "Quantization at pack time with NVIDIA ModelOpt (--hf-model, --checkpoint, --demo)"
    )
    quantize.add_argument(
        "--quantize",
        choices=["fp8", "int4_awq", "nvfp4", "w4a8_awq"],
        help="quantize the full-precision checkpoint with ModelOpt, calibrated on --calib-data, "
        "and pack its unified export (hf_quant_config.json). The CPU stand-in serves fp8, "
        "int4_awq and w4a8_awq dequantized; nvfp4 needs TensorRT-LLM on Blackwell",
    )
    quantize.add_argument(
        "--kv-cache-dtype",
        choices=["fp8"],
        help="with --quantize: the KV cache in FP8 too (kv_cache_quant_algo FP8)",
    )
    quantize.add_argument(
        "--calib-data",
        type=Path,
        help="calibration text: a .txt file (samples: paragraphs) or .jsonl file (`text` "
        "fields), or a folder of them; never downloaded (default: a short text shipped with "
        "the project)",
    )
    quantize.add_argument("--calib-size", type=int, help="calibration samples (default: 64)")

    llmapi = parser.add_argument_group("LLM API workflow (--workflow llmapi)")
    llmapi.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (default: 1)")
    llmapi.add_argument("--pp", type=int, default=1, help="pipeline_parallel_size (default: 1)")
    llmapi.add_argument("--gpus", type=int, help="GPUs of the target: tp x pp must fit them")
    llmapi.add_argument("--backend", choices=["pytorch"], default="pytorch", help="LLM backend")
    llmapi.add_argument(
        "--llmapi-model",
        choices=["bentotrtllm", "nvidia"],
        default="bentotrtllm",
        help="the Triton model: bentotrtllm (ours: every per-request feature, token ids in and "
        "out, what the service's llmapi route needs) or nvidia (NVIDIA's stock model.py of the "
        "image, text in and out, for clients that call Triton themselves)",
    )
    llmapi.add_argument(
        "--llm-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other LLM API argument for model.yaml, VALUE in YAML, dotted KEY nests; "
        "repeatable, e.g. --llm-arg kv_cache_config.free_gpu_memory_fraction=0.8 "
        "--llm-arg enable_chunked_prefill=true --llm-arg cuda_graph_config.max_batch_size=64",
    )

    fill = parser.add_argument_group("Triton template options (NVIDIA placeholder names)")
    fill.add_argument("--triton-max-batch-size", type=int, help="default: engine max_batch_size")
    fill.add_argument("--batching-strategy", choices=["inflight_fused_batching", "V1"])
    fill.add_argument("--kv-cache-free-gpu-mem-fraction", type=float)
    fill.add_argument("--max-tokens-in-paged-kv-cache", type=int)
    fill.add_argument("--max-attention-window-size", type=int)
    fill.add_argument("--enable-kv-cache-reuse", choices=["true", "false"])
    fill.add_argument("--enable-chunked-context", choices=["true", "false"])
    fill.add_argument("--max-queue-delay-microseconds", type=int)
    fill.add_argument("--max-queue-size", type=int)
    fill.add_argument("--preprocessing-instance-count", type=int)
    fill.add_argument("--postprocessing-instance-count", type=int)
    fill.add_argument("--bls-instance-count", type=int)
    fill.add_argument("--decoupled-mode", choices=["true", "false"])
    fill.add_argument("--exclude-input-in-output", choices=["true", "false"])
    fill.add_argument("--max-beam-width", type=int, help="default: engine max_beam_width")
    fill.add_argument("--accumulate-tokens", choices=["true", "false"])
    fill.add_argument(
        "--guided-decoding-backend",
        choices=["xgrammar", "off"],
        help="what enforces guided_decoding guides in tensorrt_llm (default: xgrammar); off "
        "refuses guided requests",
    )
    fill.add_argument(
        "--fill",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other template placeholder, e.g. --fill gpu_device_ids=0,1",
    )
    return parser


_FILL_FLAGS = (
    "triton_max_batch_size", "batching_strategy", "kv_cache_free_gpu_mem_fraction",
    "max_tokens_in_paged_kv_cache", "max_attention_window_size", "enable_kv_cache_reuse",
    "enable_chunked_context", "max_queue_delay_microseconds", "max_queue_size",
    "preprocessing_instance_count", "postprocessing_instance_count", "bls_instance_count",
    "decoupled_mode", "exclude_input_in_output", "max_beam_width", "accumulate_tokens",
)  # fmt: skip


def _options(args: argparse.Namespace) -> dict[str, str]:
    options = {
        key: str(getattr(args, key)) for key in _FILL_FLAGS if getattr(args, key) is not None
    }
    if args.guided_decoding_backend is not None:
        backend = args.guided_decoding_backend
        options["guided_decoding_backend"] = "" if backend == "off" else backend
    options.update(_parse_pairs(args.fill, "--fill"))
    return options


def describe(pack: PackPlan) -> str:
    engine = pack.engine
    lines = [
        f"model:        {pack.name}",
        f"engine:       {engine.kind} ({engine.cpu_mode or engine.version or 'unknown version'}), "
        f"{engine.architecture}, {engine.dtype}, tp={engine.tp_size} pp={engine.pp_size}",
        f"limits:       max_batch_size={engine.max_batch_size} max_input_len={engine.max_input_len}"
        f" max_seq_len={engine.max_seq_len} max_beam_width={engine.max_beam_width}",
        f"route:        {pack.route}",
        f"files:        {len(pack.files())} ({pack.total_bytes() / 1e6:.1f} MB) from "
        f"{pack.engine_dir} and {pack.tokenizer_dir}",
        "fill options: " + ", ".join(f"{k}={v}" for k, v in sorted(pack.options.items())),
    ]
    if engine.quantization is not None:
        lines.insert(2, f"quantization: {engine.quantization.describe()}")
    lines[2:2] = describe_vision(pack.vision)
    return "\n".join(lines)


def _check_workflow(args: argparse.Namespace) -> None:
    if args.demo_vlm and args.demo_size != "tiny":
        raise PackError("--demo-size sizes --demo; the demo VLM comes in one size")
    if args.demo_vlm_family != "llava" and not args.demo_vlm:
        raise PackError("--demo-vlm-family picks the demo VLM: give it with --demo-vlm")
    if args.workflow == "llmapi" and args.scripted:
        raise PackError("--scripted is a CPU engine of the engine workflow: leave out --workflow")
    _check_quantize(args)
    if args.workflow == "llmapi":
        if args.checkpoint is None and not (args.demo or args.demo_vlm or args.synthetic):
            raise PackError(
                "--workflow llmapi packs --checkpoint DIR (or --demo, --synthetic), or the demo "
                "VLM (--demo-vlm)"
            )
        if args.route is not None or args.fill:
            raise PackError(
                "--route and --fill belong to the engine workflow; the llmapi workflow "
                "takes LLM API arguments with --llm-arg KEY=VALUE"
            )
    elif args.checkpoint is not None:
        raise PackError("--checkpoint is the llmapi workflow's: leave out --workflow engine")
    elif (
        args.llm_arg
        or args.tp != 1
        or args.pp != 1
        or args.gpus is not None
        or args.llmapi_model != "bentotrtllm"
    ):
        raise PackError(
            "--tp, --pp, --gpus, --llm-arg and --llmapi-model belong to --workflow llmapi "
            "(leave out --workflow engine); engines carry their parallelism from trtllm-build"
        )


def _check_quantize(args: argparse.Namespace) -> None:
    """--quantize takes a full-precision Hugging Face checkpoint; what the CPU stand-in will
    serve, in a format it dequantizes."""
    if args.quantize is None:
        if args.kv_cache_dtype or args.calib_data or args.calib_size is not None:
            raise PackError("--kv-cache-dtype, --calib-data and --calib-size go with --quantize")
        return
    if not (args.hf_model or args.checkpoint or args.demo):
        raise PackError(
            "--quantize quantizes a Hugging Face checkpoint: --hf-model, --checkpoint or --demo "
            "(engines are quantized by trtllm-build's checkpoint conversion)"
        )
    if args.quantize == "nvfp4" and args.checkpoint is None:
        raise PackError(
            "the CPU stand-in does not serve NVFP4 (ModelOpt's own NVFP4 fake quantization runs "
            "on CUDA only: no reference to match on a CPU): pack it for TensorRT-LLM on a "
            "Blackwell GPU with --checkpoint DIR --quantize nvfp4, or serve fp8, int4_awq or "
            "w4a8_awq on the stand-in"
        )
    from tensorrtllm_backend.packing.quantize import FORMATS

    # The target GPU's refusal before the calibration, not after it.
    _check_gpu(Quantization(algorithm=FORMATS[args.quantize][1], source="--quantize"), args)


def _check_llmapi_image(args: argparse.Namespace) -> None:
    """The LLM API's PyTorch workflow exists from TensorRT-LLM 1.0 (NGC 25.09 and later)."""
    if args.demo or args.demo_vlm or args.synthetic:
        return  # served by the CPU stand-in
    image = args.target_image or _default_image()
    version = runtime_version_for_image(image) if image else None
    if version is None or int(version.split(".")[0]) >= 1:
        return
    message = (
        f"{image} ships TensorRT-LLM {version}; the llmapi workflow needs >= 1.0 "
        "(e.g. nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3)"
    )
    if args.target_image is not None:
        raise PackError(message)
    _warn(f"{message} (checked against the default image; set docker.base_image)")


def _store_unless_dry_run(
    pack: StorablePlan, description: str, args: argparse.Namespace
) -> str | None:
    """Print what the plan stores, then store it (not with --dry-run); the stored tag."""
    print(description)
    if args.dry_run:
        print("dry run: nothing stored")
        return None
    tag = store(pack, version=args.tag, show_progress=not args.no_progress)
    print(f"stored: {tag}")
    return tag


def run_llmapi(args: argparse.Namespace) -> str | None:
    """--workflow llmapi: validate the checkpoint, then store it with the llmapi repository."""
    from tensorrtllm_backend.common.model_repository import TemplateError
    from tensorrtllm_backend.packing.llmapi_packing import describe_llmapi, plan_llmapi
    from tensorrtllm_backend.packing.llmapi_repository import parse_llm_args

    try:
        llm_args = parse_llm_args(args.llm_arg)
    except TemplateError as error:
        raise PackError(str(error)) from error
    _check_llmapi_image(args)
    with staging_dir("pack-model-") as scratch:
        if args.demo:
            from tensorrtllm_backend.packing.demo import build_demo_checkpoint

            checkpoint = build_demo_checkpoint(scratch / "demo-checkpoint", size=args.demo_size)
            source = "demo"
        elif args.demo_vlm:  # a demo too (the CPU stand-in's); its manifest records images
            from tensorrtllm_backend.packing.demo import build_demo_vlm_family

            checkpoint = build_demo_vlm_family(
                scratch / "demo-vlm-checkpoint", args.demo_vlm_family
            )
            source = "demo"
        elif args.synthetic:
            checkpoint, source = _synthetic_checkpoint(args, scratch), "synthetic"
            llm_args.setdefault("guided_decoding_backend", None)  # no logits to guide
        else:
            checkpoint, source = args.checkpoint, "checkpoint"
        name = args.name or LLMAPI_DEMO_NAMES.get(_name_key(args, source))
        name = name or _default_name(checkpoint, args)
        if args.quantize is not None:
            from tensorrtllm_backend.packing.quantize import quantize_checkpoint

            name = name if args.name else f"{name}-{args.quantize}"
            checkpoint = quantize_checkpoint(
                checkpoint, scratch / "quantized", args.quantize, args.kv_cache_dtype,
                args.calib_data, args.calib_size, show_progress=not args.no_progress,
            )  # fmt: skip
        limits = (
            {key: getattr(args, key) or CPU_LIMITS[key] for key in CPU_LIMITS}
            if source == "synthetic"
            else {key: getattr(args, key) for key in CPU_LIMITS}
        )
        pack = plan_llmapi(
            name=name, checkpoint_dir=checkpoint, tokenizer_dir=args.tokenizer_dir,
            source=source, tp_size=args.tp, pp_size=args.pp, gpus=args.gpus,
            backend=args.backend, llm_args=llm_args, llmapi_model=args.llmapi_model,
            loras={k: Path(v) for k, v in _parse_pairs(args.lora, "--lora").items()}, **limits,
        )  # fmt: skip
        _check_gpu(pack.checkpoint.quantization, args)
        return _store_unless_dry_run(pack, describe_llmapi(pack), args)


def _synthetic_checkpoint(args: argparse.Namespace, scratch: Path) -> Path:
    """The synthetic CPU engine as the llmapi stand-in's `model`: its config.json, with the
    demo tokenizer beside it (the LLM API reads the tokenizer from the model's directory)."""
    import shutil

    engine_dir, tokenizer_dir, _source = build_cpu_engine(args, scratch)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file() and name != "config.json":
            shutil.copy(tokenizer_dir / name, engine_dir / name)
    return engine_dir


def _inferred_workflow(args: argparse.Namespace) -> str:
    """The workflow of what is packed: a checkpoint, or options only the LLM API takes, are the
    llmapi workflow's; engines and the CPU stand-ins the engine workflow's."""
    llmapi_options = (
        args.llm_arg
        or args.tp != 1
        or args.pp != 1
        or args.gpus is not None
        or args.llmapi_model != "bentotrtllm"
    )
    return "llmapi" if args.checkpoint is not None or llmapi_options else "engine"


def _check_gpu(quantization: Quantization | None, args: argparse.Namespace) -> None:
    """A quantized model whose format the target GPU cannot run is refused before it is stored
    (`quantization`: what the plan's inspection found)."""
    if quantization is None:
        return
    refusal = gpu_refusal(quantization, args.gpu_type or load_settings().gpu_type)
    if refusal is not None:
        raise PackError(refusal)


def run(args: argparse.Namespace) -> str | None:
    if args.workflow is None:
        args.workflow = _inferred_workflow(args)
    _check_workflow(args)
    if args.workflow == "llmapi":
        return run_llmapi(args)
    options = _options(args)
    explicit_image = args.target_image is not None
    image = args.target_image if explicit_image else _default_image()
    runtime = runtime_version_for_image(image) if image else None
    if args.engine_dir is not None and image and runtime is None:
        _warn(f"unknown TensorRT-LLM release in {image}; the engine's version is not checked")
    with staging_dir("pack-model-") as scratch:
        if args.engine_dir is not None:
            if args.tokenizer_dir is None:
                raise PackError("--engine-dir needs --tokenizer-dir (the model's HF tokenizer)")
            engine_dir, tokenizer_dir, source = args.engine_dir, args.tokenizer_dir, "engine"
        else:
            engine_dir, tokenizer_dir, source = build_cpu_engine(args, scratch)
        name = args.name or DEFAULT_NAMES.get(_name_key(args, source))
        name = name or _default_name(engine_dir, args)
        if args.quantize is not None and not args.name:
            name = f"{name}-{args.quantize}"
        pack = plan(
            name=name, engine_dir=engine_dir, tokenizer_dir=tokenizer_dir, source=source,
            option_overrides=options, runtime_version=runtime if explicit_image else None,
            route=args.route or "direct",
            loras={k: Path(v) for k, v in _parse_pairs(args.lora, "--lora").items()},
        )  # fmt: skip
        _check_gpu(pack.engine.quantization, args)
        for warning in pack.warnings:
            _warn(warning)
        if not explicit_image:
            try:
                check_runtime_compatibility(pack.engine, runtime)
            except EngineConfigError as error:
                _warn(f"{error} (checked against the default image {image})")
        return _store_unless_dry_run(pack, describe(pack), args)


def _name_key(args: argparse.Namespace, source: str) -> str:
    """The default-name key of what is packed: its source, told apart for the demo VLMs."""
    if not args.demo_vlm:
        return source
    return "demo-vlm" if args.demo_vlm_family == "llava" else f"demo-{args.demo_vlm_family}"


def _default_name(engine_dir: Path, args: argparse.Namespace) -> str:
    base = (args.hf_model or engine_dir).resolve().name.lower()  # engine or checkpoint dir
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in base).strip("-._")
    return f"trtllm-{cleaned or 'model'}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except PackError as error:
        print(f"pack_model: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"pack_model: error: {error}; nothing stored", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pack_model: interrupted, nothing stored", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
