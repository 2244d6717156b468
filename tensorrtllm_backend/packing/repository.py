"""Fill the inflight_batcher_llm templates into a Triton model repository (pack time).

The templates keep NVIDIA's ``${placeholder}`` names so their fill commands and docs carry over.
Unlike NVIDIA's ``fill_template.py`` (``safe_substitute``, unfilled placeholders stay literal),
filling here is strict: unknown keys and leftover placeholders are errors, values that would make
the protobuf unparsable fall back to a default, and every filled config is parsed as a Triton
``ModelConfig`` before anything is written, so a repository on disk is always loadable by Triton's
config parser.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from string import Template

from tritonclient.grpc import model_config_pb2

from ..common.model_repository import (
    CONFIG_NAME,
    COPY_IGNORE,
    TemplateError,
    parse_config,
    replace_dir,
    staging_dir,
)

TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "all_models" / "inflight_batcher_llm"
NVIDIA_MODEL_NAMES: tuple[str, ...] = (
    "ensemble",
    "preprocessing",
    "tensorrt_llm",
    "postprocessing",
    "tensorrt_llm_bls",
)
# prompt_logprobs is ours: prompt log probs reduced from the engine's context logits.
MODEL_NAMES: tuple[str, ...] = (*NVIDIA_MODEL_NAMES, "prompt_logprobs")

# Placeholders that sit outside a quoted string in the templates: an empty or malformed value
# there breaks the protobuf, so they are type-checked and an empty value falls back to the default.
_BOOL = "bool"
_INT = "int"
_DTYPE = "dtype"
TYPED_PLACEHOLDERS: dict[str, str] = {
    "decoupled_mode": _BOOL,
    "triton_max_batch_size": _INT,
    "max_queue_delay_microseconds": _INT,
    "max_queue_size": _INT,
    "preprocessing_instance_count": _INT,
    "postprocessing_instance_count": _INT,
    "bls_instance_count": _INT,
    "prompt_logprobs_instance_count": _INT,
    "logits_datatype": _DTYPE,
    "encoder_input_features_data_type": _DTYPE,
}

_BATCH = {"triton_max_batch_size": "64"}
_QUEUE = {"max_queue_delay_microseconds": "0", "max_queue_size": "0"}
_LOGITS = {"logits_datatype": "TYPE_FP32"}

# Defaults for every placeholder of every template. An empty string means "not set": the model
# (NVIDIA's C++ backend or our Python models) then applies its own default, as with NVIDIA's
# templates. Choices worth knowing:
# - triton_backend "tensorrtllm": a filled repository is NVIDIA's by default; the CPU path passes
#   triton_backend=python explicitly.
# - decoupled_mode "true": streaming needs it, and non-streaming requests work in decoupled mode.
# - exclude_input_in_output "true": the service returns completions, never the echoed prompt
#   (the C++ backend's own default is false).
# - tokenizer_type "auto": the only value meaningful to AutoTokenizer; kept for v0.8.0 commands.
# - tensorrt_llm_model_name "tensorrt_llm": the BLS model calls the model of the same repository.
DEFAULTS: dict[str, dict[str, str]] = {
    "ensemble": {**_BATCH, **_LOGITS},
    "preprocessing": {
        **_BATCH,
        **_QUEUE,
        "preprocessing_instance_count": "1",
        "tokenizer_dir": "",
        "tokenizer_type": "auto",
        "add_special_tokens": "",
        "multimodal_model_path": "",
        "engine_dir": "",
        "max_num_images": "",
    },
    "postprocessing": {
        **_BATCH,
        "postprocessing_instance_count": "1",
        "tokenizer_dir": "",
        "tokenizer_type": "auto",
        "skip_special_tokens": "",
    },
    "tensorrt_llm_bls": {
        **_BATCH,
        **_LOGITS,
        "decoupled_mode": "true",
        "bls_instance_count": "1",
        "accumulate_tokens": "false",
        "tensorrt_llm_model_name": "tensorrt_llm",
        "tensorrt_llm_draft_model_name": "",
        "multimodal_encoders_name": "",
    },
    "prompt_logprobs": {
        "prompt_logprobs_instance_count": "1",
        "tensorrt_llm_model_name": "tensorrt_llm",
    },
    "tensorrt_llm": {
        **_BATCH,
        **_QUEUE,
        **_LOGITS,
        "triton_backend": "tensorrtllm",
        "decoupled_mode": "true",
        "encoder_input_features_data_type": "TYPE_FP16",
        "batching_strategy": "inflight_fused_batching",
        "engine_dir": "",
        "encoder_engine_dir": "",
        "max_beam_width": "1",
        "kv_cache_free_gpu_mem_fraction": "0.9",
        "exclude_input_in_output": "true",
        **dict.fromkeys(
            (
                "max_tokens_in_paged_kv_cache",
                "max_attention_window_size",
                "sink_token_length",
                "batch_scheduler_policy",
                "cross_kv_cache_fraction",
                "kv_cache_host_memory_bytes",
                "kv_cache_onboard_blocks",
                "enable_trt_overlap",
                "cancellation_check_period_ms",
                "stats_check_period_ms",
                "iter_stats_max_iterations",
                "request_stats_max_iterations",
                "enable_kv_cache_reuse",
                "normalize_log_probs",
                "enable_chunked_context",
                "gpu_device_ids",
                "participant_ids",
                "num_nodes",
                "lora_cache_optimal_adapter_size",
                "lora_cache_max_adapter_size",
                "lora_cache_gpu_memory_fraction",
                "lora_cache_host_memory_bytes",
                "lora_prefetch_dir",
                "decoding_mode",
                "lookahead_window_size",
                "lookahead_ngram_size",
                "lookahead_verification_set_size",
                "medusa_choices",
                "eagle_choices",
                "gpu_weights_percent",
                "enable_context_fmha_fp32_acc",
                "multi_block_mode",
                "cuda_graph_mode",
                "cuda_graph_cache_size",
                "speculative_decoding_fast_logits",
                "tokenizer_dir",
                "guided_decoding_backend",
                "xgrammar_tokenizer_info_path",
                "stream_interval",
            ),
            "",
        ),
    },
}

_BRACED = re.compile(r"\$\{([^}]*)\}")
_TRUE = frozenset({"true", "1", "yes", "on", "t"})
_FALSE = frozenset({"false", "0", "no", "off", "f"})


def placeholders(text: str) -> set[str]:
    """Names of the ``${name}`` / ``$name`` placeholders in ``text`` (string.Template syntax)."""
    names: set[str] = set()
    for match in Template.pattern.finditer(text):
        name = match.group("named") or match.group("braced")
        if name:
            names.add(name)
    return names


def template_placeholders(templates_dir: Path = TEMPLATES_DIR) -> dict[str, set[str]]:
    """Placeholders of each model template found in ``templates_dir``."""
    return {
        model: placeholders((templates_dir / model / CONFIG_NAME).read_text())
        for model in MODEL_NAMES
        if (templates_dir / model / CONFIG_NAME).is_file()
    }


def _as_text(value: object) -> str:
    """Option values may arrive as Python bools/ints (pack-time options): render them as text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _typed_value(name: str, value: str) -> str:
    """Check a placeholder that lands outside quotes and normalise it (bools to true/false)."""
    kind = TYPED_PLACEHOLDERS[name]
    text = value.strip()
    if kind == _BOOL:
        if text.lower() in _TRUE:
            return "true"
        if text.lower() in _FALSE:
            return "false"
        raise TemplateError(f"{name} must be true or false, got {value!r}")
    if kind == _INT:
        if not re.fullmatch(r"[0-9]+", text):
            raise TemplateError(f"{name} must be a non-negative integer, got {value!r}")
        return text
    if not re.fullmatch(r"TYPE_[A-Z0-9]+", text) or text not in model_config_pb2.DataType.keys():
        valid = ", ".join(k for k in model_config_pb2.DataType.keys() if k != "TYPE_INVALID")
        raise TemplateError(f"{name} must be a Triton data type ({valid}), got {value!r}")
    return text


def fill_template(
    text: str,
    values: Mapping[str, object],
    *,
    model: str,
    use_defaults: bool = True,
) -> str:
    """Substitute ``values`` into one template and return the filled text.

    ``model`` selects the defaults (one of MODEL_NAMES). Keys not in the template, malformed typed
    values and placeholders left unfilled raise TemplateError. An empty value means "not set": it is
    substituted as the empty string, except for typed placeholders (numbers, bools, data types)
    where it falls back to the default so the config stays parsable.
    """
    if model not in DEFAULTS:
        raise TemplateError(f"unknown model {model!r}; expected one of: {', '.join(MODEL_NAMES)}")
    names = placeholders(text)
    unknown = sorted(set(values) - names)
    if unknown:
        raise TemplateError(
            f"{model}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(names))}"
        )
    defaults = DEFAULTS[model]
    substitutions: dict[str, str] = {}
    for name in names:
        value = _as_text(values[name]) if name in values else None
        typed = name in TYPED_PLACEHOLDERS
        if (value is None and use_defaults) or (value == "" and typed):
            value = defaults.get(name)
        if value is None:
            continue
        substitutions[name] = _typed_value(name, value) if typed else value
    filled = Template(text).safe_substitute(substitutions)
    leftover = sorted(set(_BRACED.findall(filled)))
    if leftover:
        raise TemplateError(f"{model}: placeholder(s) left unfilled: {', '.join(leftover)}")
    return filled


def _fill_model_config(model_dir: Path, model: str, values: Mapping[str, object]) -> str:
    """Fill and validate one model's config; returns the text to write."""
    text = (model_dir / CONFIG_NAME).read_text()
    filled = fill_template(text, values, model=model)
    config = parse_config(filled, source=f"{model}/{CONFIG_NAME}")
    if config.name != model:
        raise TemplateError(
            f"{model}/{CONFIG_NAME}: name is {config.name!r}; Triton requires it to match the "
            f"folder name {model!r}"
        )
    return filled


def fill_repository(
    dst: Path,
    options: Mapping[str, object],
    *,
    templates_dir: Path = TEMPLATES_DIR,
    models: Iterable[str] = MODEL_NAMES,
    overwrite: bool = False,
) -> Path:
    """Write a filled model repository to ``dst`` (all of it or nothing) and return ``dst``.

    Each model folder (config.pbtxt and ``1/`` with its model.py) is copied and its config filled
    with the options whose keys occur in that template; unset placeholders take DEFAULTS. A key
    used by no selected template is an error. Everything is written to a temporary directory next
    to ``dst`` and renamed into place only once every config has been filled and parsed.
    """
    dst = Path(dst)
    templates_dir = Path(templates_dir)
    models = tuple(models)
    missing = [m for m in models if not (templates_dir / m / CONFIG_NAME).is_file()]
    if missing:
        raise TemplateError(f"no {CONFIG_NAME} for {', '.join(missing)} in {templates_dir}")
    per_model = {m: placeholders((templates_dir / m / CONFIG_NAME).read_text()) for m in models}
    known = set().union(*per_model.values())
    unknown = sorted(set(options) - known)
    if unknown:
        raise TemplateError(
            f"unknown option(s) {', '.join(unknown)}: no template uses them; "
            f"valid options: {', '.join(sorted(known))}"
        )
    tmp = staging_dir(dst, overwrite)
    try:
        for model in models:
            src_dir = templates_dir / model
            out_dir = tmp / model
            shutil.copytree(src_dir, out_dir, ignore=COPY_IGNORE, symlinks=False)
            subset = {k: v for k, v in options.items() if k in per_model[model]}
            filled = _fill_model_config(src_dir, model, subset)
            (out_dir / CONFIG_NAME).write_text(filled)
            (out_dir / "1").mkdir(exist_ok=True)
        replace_dir(tmp, dst, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst
