"""Inspect a Hugging Face checkpoint for TensorRT-LLM's LLM API (the PyTorch backend, >= 1.0).

That workflow builds no engine: `tensorrt_llm.LLM(model=<checkpoint>)` reads the checkpoint as
Hugging Face wrote it. What can go wrong is then found only when the model loads on a GPU, minutes
into a deployment. So everything that can be checked from the files is checked at pack time:
config.json parses, its architecture is one TensorRT-LLM's PyTorch backend implements, the dtype
is one it runs, weights (safetensors) and a tokenizer are there, and the parallel layout
(tp x pp) splits the model and fits the GPUs asked for.

Whether a checkpoint takes images (a vision-language model) is decided here too, by
:func:`vision_info`, for every workflow that packs a Hugging Face checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field

from ..common.engine_config import PackedSummary, read_config_json
from ..common.quantization import Quantization, from_checkpoint
from ..common.tokenization import load_checked_tokenizer, load_tokenizer

# Model classes of TensorRT-LLM's PyTorch backend (tensorrt_llm/_torch/models, 1.0 / 1.1 support
# matrix), by the `architectures` name Hugging Face writes into config.json. Data, not logic:
# add a name here when a TensorRT-LLM release adds the model.
PYTORCH_ARCHITECTURES: frozenset[str] = frozenset(
    {
        "BertForSequenceClassification",
        "DeciLMForCausalLM",
        "DeepseekV3ForCausalLM",
        "Exaone4ForCausalLM",
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
        "GptOssForCausalLM",
        "HCXVisionForCausalLM",
        "Llama4ForConditionalGeneration",
        "LlamaForCausalLM",
        "LlavaLlamaModel",
        "LlavaNextForConditionalGeneration",
        "Mistral3ForConditionalGeneration",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "MllamaForConditionalGeneration",
        "NemotronForCausalLM",
        "NemotronHForCausalLM",
        "NemotronNASForCausalLM",
        "Phi3ForCausalLM",
        "Phi4MMForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen2ForProcessRewardModel",
        "Qwen2ForRewardModel",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
    }
)

# config.json's `torch_dtype` (transformers < 5) or `dtype` (transformers >= 5).
DTYPES: frozenset[str] = frozenset({"float16", "bfloat16", "float32"})

TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
SAFETENSORS_INDEX = "model.safetensors.index.json"
# A vision-language model's processor settings, stored beside its tokenizer (AutoProcessor reads
# both from one directory): the image processor's (transformers 4 reads preprocessor_config.json;
# 5 nests them in processor_config.json, with the processor's own: placeholder, patch size).
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


class CheckpointError(ValueError):
    """The checkpoint cannot be served by the LLM API; the message says what to fix."""


class CheckpointInfo(PackedSummary):
    """What a checkpoint holds, as far as packing and serving it is concerned."""

    FILES = "weight_files"

    path: Path
    architecture: str
    model_type: str | None = None
    dtype: str = "auto"
    vocab_size: int | None = None
    max_position_embeddings: int | None = None
    num_attention_heads: int | None = None
    num_hidden_layers: int | None = None
    weight_files: list[str] = Field(default_factory=list)
    tp_size: int = 1
    pp_size: int = 1
    quantization: Quantization | None = None  # ModelOpt's or Hugging Face's, as stored


def _quantization(checkpoint: Path) -> Quantization | None:
    try:
        return from_checkpoint(checkpoint)
    except ValueError as error:
        raise CheckpointError(str(error)) from None


def _architecture(data: dict[str, Any], config_path: Path, stand_in: bool = False) -> str:
    """config.json's architectures[0]: one TensorRT-LLM's PyTorch backend implements, unless the
    CPU stand-in (transformers) serves the checkpoint (`stand_in`)."""
    architectures = data.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise CheckpointError(
            f"{config_path} names no `architectures`: TensorRT-LLM picks the model class by it"
        )
    name = architectures[0]
    if not stand_in and name not in PYTORCH_ARCHITECTURES:
        known = ", ".join(sorted(PYTORCH_ARCHITECTURES))
        raise CheckpointError(
            f"architecture {name!r} is not one TensorRT-LLM's PyTorch backend implements; "
            f"known: {known}"
        )
    return str(name)


def language_config(data: dict[str, Any]) -> dict[str, Any]:
    """The language model's settings of a config.json: a vision-language model nests them in
    `text_config` (vocab_size, max_position_embeddings, heads, layers), which win over top-level
    ones; a text-only model's config.json is the language model's."""
    text = data.get("text_config")
    return {**data, **text} if isinstance(text, dict) else data


def _dtype(data: dict[str, Any], config_path: Path) -> str:
    text_config = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
    value = data.get("dtype") or data.get("torch_dtype") or text_config.get("torch_dtype")
    if value is None:
        return "auto"
    if value not in DTYPES:
        raise CheckpointError(
            f"{config_path}: dtype {value!r} is not one the LLM API loads "
            f"({', '.join(sorted(DTYPES))})"
        )
    return str(value)


def _weight_files(checkpoint: Path) -> list[str]:
    """The safetensors shards, checked against the index when there is one."""
    index_path = checkpoint / SAFETENSORS_INDEX
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise CheckpointError(f"{index_path} is not a safetensors index: {error}") from error
        missing = [name for name in shards if not (checkpoint / name).is_file()]
        if missing:
            raise CheckpointError(
                f"{checkpoint} is missing weight shard(s) {', '.join(missing)} named in "
                f"{SAFETENSORS_INDEX}: the download is incomplete"
            )
        return shards
    shards = sorted(path.name for path in checkpoint.glob("*.safetensors") if path.is_file())
    if not shards:
        raise CheckpointError(
            f"no *.safetensors weights in {checkpoint}: the LLM API loads safetensors "
            "(convert .bin weights with transformers' save_pretrained(safe_serialization=True))"
        )
    return shards


def check_tokenizer(tokenizer_dir: Path) -> None:
    """A tokenizer the service and the model can load, with an end token."""
    load_checked_tokenizer(
        tokenizer_dir,
        TOKENIZER_MARKERS,
        "copy the model's tokenizer files next to config.json, or pass --tokenizer-dir",
        CheckpointError,
    )


def _positive(value: object, flag: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{flag} must be a whole number >= 1, got {value!r}")
    return value


def _check_parallel(info: CheckpointInfo, gpus: int | None) -> None:
    heads, layers = info.num_attention_heads, info.num_hidden_layers
    if heads and heads % info.tp_size:
        raise CheckpointError(
            f"--tp {info.tp_size} does not divide the model's {heads} attention heads: "
            "tensor parallelism splits the heads evenly over the GPUs"
        )
    if layers and info.pp_size > layers:
        raise CheckpointError(
            f"--pp {info.pp_size} exceeds the model's {layers} layers: each pipeline stage "
            "needs at least one layer"
        )
    if gpus is not None and info.world_size > gpus:
        raise CheckpointError(
            f"world size tp x pp = {info.tp_size} x {info.pp_size} = {info.world_size} needs "
            f"{info.world_size} GPUs, but --gpus is {gpus}: lower --tp/--pp or ask for more GPUs"
        )


def _int_or_none(*values: object) -> int | None:
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def inspect_checkpoint(
    checkpoint: Path | str,
    *,
    tp_size: int = 1,
    pp_size: int = 1,
    gpus: int | None = None,
    tokenizer_dir: Path | None = None,
    stand_in: bool = False,
) -> CheckpointInfo:
    """Read and check a checkpoint; raise CheckpointError naming what is wrong. `stand_in`: the
    CPU stand-in serves it with transformers, so any architecture goes."""
    checkpoint = Path(checkpoint)
    data = read_config_json(
        checkpoint,
        "checkpoint directory",
        f"{checkpoint} has no config.json: point --checkpoint at a Hugging Face model directory "
        "(config.json, *.safetensors, tokenizer files)",
        CheckpointError,
    )
    config_path = checkpoint / "config.json"
    language = language_config(data)
    info = CheckpointInfo(
        path=checkpoint,
        architecture=_architecture(data, config_path, stand_in),
        model_type=data.get("model_type"),
        dtype=_dtype(data, config_path),
        vocab_size=_int_or_none(language.get("vocab_size")),
        max_position_embeddings=_int_or_none(language.get("max_position_embeddings")),
        num_attention_heads=_int_or_none(language.get("num_attention_heads")),
        num_hidden_layers=_int_or_none(language.get("num_hidden_layers")),
        weight_files=_weight_files(checkpoint),
        tp_size=_positive(tp_size, "--tp"),
        pp_size=_positive(pp_size, "--pp"),
        quantization=_quantization(checkpoint),
    )
    if gpus is not None:
        _positive(gpus, "--gpus")
    _check_parallel(info, gpus)
    check_tokenizer(tokenizer_dir or checkpoint)
    return info


def _json_object(path: Path) -> dict[str, Any]:
    """The object in a JSON file; {} when it is missing or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _has_image_processor(checkpoint: Path) -> bool:
    preprocessor = _json_object(checkpoint / "preprocessor_config.json")
    processor = _json_object(checkpoint / "processor_config.json")
    return "image_processor_type" in preprocessor or isinstance(
        processor.get("image_processor"), dict
    )


def vision_info(checkpoint: Path, tokenizer_dir: Path | None = None) -> dict[str, Any] | None:
    """The vision record of an image-text-to-text checkpoint (a vision-language model); None for
    a text-only one. Raises CheckpointError when a VLM cannot be served with images.

    The rule: a checkpoint takes images when its config.json has a `vision_config` object (LLaVA,
    LLaVA-NeXT, Qwen2-VL, Gemma 3, Mllama, Llama 4 and Mistral 3 nest their vision tower's
    settings there), or when it ships an image processor (preprocessor_config.json naming an
    `image_processor_type`, or transformers 5's processor_config.json with an `image_processor`
    section). An architecture name is no sign: T5's and Whisper's end in ForConditionalGeneration
    too, and Whisper ships a (sound) feature extractor.

    The record: config.json's architectures[0] and model_type, and the token whose positions the
    processor expands for each image and the image features fill (config.json's image_token_id,
    image_token_index before transformers 5, else the tokenizer's or processor's image_token),
    as string and id of the tokenizer in `tokenizer_dir` (default: the checkpoint's).
    """
    checkpoint = Path(checkpoint)
    config = _json_object(checkpoint / "config.json")
    if not isinstance(config.get("vision_config"), dict) and not _has_image_processor(checkpoint):
        return None
    if not any((checkpoint / name).is_file() for name in PROCESSOR_FILES):
        raise CheckpointError(
            f"{checkpoint} is a vision-language model (config.json has a vision_config) without "
            f"its processor ({' or '.join(PROCESSOR_FILES)}): copy the processor files of the "
            "model's download next to config.json"
        )
    tokenizer = load_tokenizer(tokenizer_dir or checkpoint)
    token_id = _int_or_none(config.get("image_token_id"), config.get("image_token_index"))
    if token_id is not None and 0 <= token_id < len(tokenizer):
        token = tokenizer.convert_ids_to_tokens(token_id)
    else:  # none, or a marker outside the vocabulary (Phi-3-vision's negative ids)
        token = getattr(tokenizer, "image_token", None) or _json_object(
            checkpoint / "processor_config.json"
        ).get("image_token")
        token_id = tokenizer.get_vocab().get(token) if isinstance(token, str) else None
    if not isinstance(token, str) or token_id is None:
        raise CheckpointError(
            f"{checkpoint}: no image token the tokenizer knows (config.json's image_token_id or "
            "image_token_index, or the processor's image_token): the prompt cannot hold images"
        )
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise CheckpointError(f"{checkpoint / 'config.json'} names no `architectures`")
    return {
        "architecture": str(architectures[0]),
        "model_type": config.get("model_type"),
        "image_token": token,
        "image_token_id": token_id,
    }


def describe_vision(vision: dict[str, Any] | None) -> list[str]:
    """The pack summary's line about images: none for a text-only model."""
    if vision is None:
        return []
    return [f"images:       yes ({vision['architecture']}, {vision['image_token']})"]
