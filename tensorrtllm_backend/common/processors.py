"""A vision-language model's processor, loaded as AutoProcessor loads it.

Qwen2-VL's processors (Qwen2-VL, Qwen2.5-VL) hold a video processor beside the image processor
and the tokenizer, and transformers' video processors need torchvision, which the CPU install
lacks (PyPI's torchvision is a CUDA build that does not import beside torch's CPU build). Where
AutoProcessor fails for that reason alone, the same processor class is loaded without its video
processor: images are expanded by the processor's own code, videos are not taken anyway.
Imports nothing from the service or the stubs: the worker, the packer and the llmapi stand-in
load processors through here.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

# The files naming a processor class, in the order AutoProcessor reads them.
_CLASS_FILES = ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json")


def load_processor(directory: str | Path) -> Any:
    """AutoProcessor of `directory` (local files only); without torchvision, a processor that
    takes a video processor is loaded without it."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(str(directory), local_files_only=True)
    except ImportError:
        without_video = _without_video_processor(Path(directory))
        if without_video is None:
            raise
        return without_video.from_pretrained(str(directory), local_files_only=True)


def _without_video_processor(directory: Path) -> type | None:
    """The directory's processor class less its video processor, where torchvision is missing
    and the class takes one; None otherwise (the ImportError is another one)."""
    import transformers
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return None
    cls = getattr(transformers, _processor_class_name(directory) or "", None)
    if not isinstance(cls, type) or "video_processor" not in _init_parameters(cls):
        return None

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # ProcessorMixin loads and checks the sub-processors this signature names: the video
        # processor is not one of them, and the class's own __init__ gets None for it.
        cls.__init__(
            self, image_processor, tokenizer, video_processor=None, chat_template=chat_template,
            **kwargs,
        )  # fmt: skip

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": __name__})


def _init_parameters(cls: type) -> set[str]:
    try:
        return set(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        return set()


def _processor_class_name(directory: Path) -> str | None:
    """The processor class a model's files name (`processor_class`), else the one transformers
    maps its config.json's model_type to."""
    for name in _CLASS_FILES:
        value = _json(directory / name).get("processor_class")
        if isinstance(value, str):
            return value
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    model_type = _json(directory / "config.json").get("model_type")
    found = PROCESSOR_MAPPING_NAMES.get(model_type) if isinstance(model_type, str) else None
    return found if isinstance(found, str) else None


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
