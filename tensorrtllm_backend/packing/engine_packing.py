"""Assemble engines + tokenizer + a filled Triton repository and store them as a BentoML model.

Layout of a stored model (paths inside the repository are relative to the model's root and are
resolved when the service starts, so a Bento built on one machine runs on another)::

    engines/            TensorRT-LLM engine dir (config.json, rank*.engine) or a CPU engine dir
                        (an hf-mode one holds the Hugging Face checkpoint in engines/checkpoint/)
    tokenizer/          tokenizer files (AutoTokenizer); a vision-language model's processor files
                        too (AutoProcessor)
    model_repository/   filled Triton repository: ensemble, preprocessing, tensorrt_llm, ...
    trtllm_model.json   manifest: engine summary, fill options, default route; `vision` for a
                        vision-language model (the CPU engine's checkpoints only)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tqdm import tqdm

from ..common.cpu_engine_config import load_engine_config
from ..common.engine_config import EngineInfo, check_runtime_compatibility, inspect_engine
from ..common.lora import (
    CONFIG_FILE,
    LORAS,
    WEIGHTS_FILE,
    LoraError,
    check_adapter_dir,
    check_name,
)
from ..common.model_repository import TemplateError
from ..common.model_store import ENGINES, FORMAT, MANIFEST, REPOSITORY, TOKENIZER, VISION
from ..common.tokenization import load_checked_tokenizer, record_tokenizer_class
from .checkpoint import PROCESSOR_FILES, CheckpointError, vision_info
from .repository import fill_repository
from .xgrammar_info import FILE_NAME as XGRAMMAR_INFO_FILE
from .xgrammar_info import TokenizerInfoError, tokenizer_info, write_tokenizer_info

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Written at pack time for NVIDIA's C++ backend, which reads the vocabulary for guided decoding
# from this file rather than from tokenizer_dir (relative: localized where the model is served).
XGRAMMAR_TOKENIZER_INFO = f"{TOKENIZER}/{XGRAMMAR_INFO_FILE}"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "config.json",
)
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


class PackError(ValueError):
    """Packing cannot proceed; the message says what to fix. Nothing was stored."""


def processor_files(processor_dir: Path, tokenizer_dir: Path) -> list[tuple[Path, Path]]:
    """(source file, path inside the model) of a vision-language model's processor, stored in
    the tokenizer directory (AutoProcessor reads processor and tokenizer from one directory);
    its chat template only where the tokenizer brings none."""
    names = [
        *PROCESSOR_FILES,
        *(name for name in CHAT_TEMPLATE_FILES if not (tokenizer_dir / name).is_file()),
    ]
    return [
        (processor_dir / name, Path(TOKENIZER) / name)
        for name in names
        if (processor_dir / name).is_file()
    ]


def check_vision(
    checkpoint_dir: Path, tokenizer_dir: Path
) -> tuple[dict[str, Any] | None, list[tuple[Path, Path]]]:
    """Pack time, for a Hugging Face checkpoint: its vision record (None: text only) and, for a
    vision-language model, the processor files to store; AutoProcessor must load from the
    tokenizer directory as stored, as the service will load it (raises PackError)."""
    try:
        vision = vision_info(checkpoint_dir, tokenizer_dir)
    except CheckpointError as error:
        raise PackError(str(error)) from error
    if vision is None:
        return None, []
    files = processor_files(checkpoint_dir, tokenizer_dir)
    stored = [(tokenizer_dir / name, Path(TOKENIZER) / name) for name in TOKENIZER_FILES] + files
    from ..common.processors import load_processor

    with tempfile.TemporaryDirectory() as scratch:
        for src, rel in stored:
            if src.is_file():
                os.symlink(src.resolve(), Path(scratch) / rel.name)
        try:
            load_processor(scratch)
        except Exception as error:  # transformers raises many kinds
            raise PackError(
                f"{checkpoint_dir} takes images, but its processor does not load with "
                f"AutoProcessor from its files and the tokenizer's: {error}"
            ) from error
    return vision, files


@dataclass
class PackPlan:
    """Everything that will be stored, decided and validated before anything is written."""

    name: str
    engine_dir: Path
    tokenizer_dir: Path
    engine: EngineInfo
    options: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)
    route: str = "direct"
    source: str = "engine"
    loras: dict[str, Path] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    vision: dict[str, Any] | None = None  # the manifest's record of a vision-language model
    processor: list[tuple[Path, Path]] = field(default_factory=list)  # its processor's files

    def files(self) -> list[tuple[Path, Path]]:
        """(source file, path inside the model) for engines, tokenizer (and processor)."""
        pairs = [
            (path, Path(ENGINES) / path.relative_to(self.engine_dir))
            for path in sorted(self.engine_dir.rglob("*"))
            if path.is_file()
        ]
        pairs += [
            (self.tokenizer_dir / name, Path(TOKENIZER) / name)
            for name in TOKENIZER_FILES
            if (self.tokenizer_dir / name).is_file()
        ]
        pairs += self.processor
        pairs += [
            (path / name, Path(LORAS) / adapter / name)
            for adapter, path in sorted(self.loras.items())
            for name in (WEIGHTS_FILE, CONFIG_FILE)
        ]
        return pairs

    def total_bytes(self) -> int:
        return sum(src.stat().st_size for src, _ in self.files())

    def metadata(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "source": self.source,
            "route": self.route,
            **{f"engine_{k}": v for k, v in self.engine.metadata().items()},
        }

    def write_tree(self, root: Path, show_progress: bool = True) -> None:
        write_model_tree(self, root, show_progress)

    def manifest(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "source": self.source,
            "route": self.route,
            "engine": self.engine.model_dump(mode="json", exclude={"path"}),
            "fill_options": self.options,
            "loras": sorted(self.loras),
            **({VISION: self.vision} if self.vision is not None else {}),
        }


def template_options(
    engine: EngineInfo, overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Fill values for the templates: the BentoML guide's choices, adapted to the engine."""
    cpu = engine.kind == "cpu"
    options = {
        "triton_backend": "python" if cpu else "tensorrtllm",
        "triton_max_batch_size": str(engine.max_batch_size),
        "decoupled_mode": "true",
        "max_beam_width": str(engine.max_beam_width),
        "engine_dir": ENGINES,
        # tensorrt_llm enforces guided_decoding guides with xgrammar against the stored tokenizer
        # (tokenizer_dir is filled into every template that has it, tensorrt_llm's included).
        "tokenizer_dir": TOKENIZER,
        "guided_decoding_backend": "xgrammar",
        "max_tokens_in_paged_kv_cache": "",
        "max_attention_window_size": "",
        "kv_cache_free_gpu_mem_fraction": "0.9",
        "exclude_input_in_output": "true",
        "batching_strategy": "inflight_fused_batching",
        "max_queue_delay_microseconds": "0",
        "enable_chunked_context": "false" if cpu else "true",
        "enable_kv_cache_reuse": "false",
        "preprocessing_instance_count": "1",
        "postprocessing_instance_count": "1" if cpu else "8",
        "bls_instance_count": "1",
        "accumulate_tokens": "false",
    }
    options.update(overrides or {})
    if (
        options["triton_backend"] == "tensorrtllm"
        and options["guided_decoding_backend"]
        and "xgrammar_tokenizer_info_path" not in (overrides or {})
    ):
        options["xgrammar_tokenizer_info_path"] = XGRAMMAR_TOKENIZER_INFO
    return options


def _check_tokenizer(tokenizer_dir: Path) -> PreTrainedTokenizerBase:
    return load_checked_tokenizer(
        tokenizer_dir,
        TOKENIZER_FILES[:5],
        "pass --tokenizer-dir with the Hugging Face tokenizer of the model",
        PackError,
    )


def _check_xgrammar_info(
    tokenizer: PreTrainedTokenizerBase,
    options: dict[str, str],
    overrides: Mapping[str, str],
    warnings: list[str],
) -> None:
    """Make sure the C++ backend's tokenizer file can be written, before anything is stored.

    A tokenizer without a tokenizer.json backend cannot be described to xgrammar. When guided
    decoding was asked for explicitly that is an error; by default guided decoding is turned off
    for the model instead (the service then refuses guided requests with a 400), with a warning.
    """
    if options.get("xgrammar_tokenizer_info_path") != XGRAMMAR_TOKENIZER_INFO:
        return
    try:
        tokenizer_info(tokenizer)
    except TokenizerInfoError as error:
        if "guided_decoding_backend" in overrides:
            raise PackError(f"--guided-decoding-backend xgrammar: {error}") from error
        options["guided_decoding_backend"] = ""
        del options["xgrammar_tokenizer_info_path"]
        warnings.append(f"guided decoding turned off for this model: {error}")


def plan(
    *,
    name: str,
    engine_dir: Path,
    tokenizer_dir: Path,
    source: str,
    option_overrides: Mapping[str, str] | None = None,
    runtime_version: str | None = None,
    route: str = "direct",
    loras: Mapping[str, Path] | None = None,
) -> PackPlan:
    """Validate the inputs and decide what to store (raises PackError, writes nothing)."""
    check_tag(name)
    try:
        engine = inspect_engine(engine_dir)
        check_runtime_compatibility(engine, runtime_version)
    except ValueError as error:
        raise PackError(str(error)) from error
    tokenizer = _check_tokenizer(tokenizer_dir)
    # The CPU engine's transformers checkpoint may take images; engines of --engine-dir never do.
    vision, processor = (
        check_vision(load_engine_config(engine_dir).checkpoint_path(), tokenizer_dir)
        if source != "engine" and engine.cpu_mode == "hf"
        else (None, [])
    )
    adapters = _check_loras(engine, loras or {})
    options = template_options(engine, option_overrides)
    warnings: list[str] = []
    _check_xgrammar_info(tokenizer, options, option_overrides or {}, warnings)
    with tempfile.TemporaryDirectory() as scratch:  # fill once now so bad options fail early
        try:
            fill_repository(Path(scratch) / REPOSITORY, options)
        except TemplateError as error:
            raise PackError(str(error)) from error
    return PackPlan(
        name=name,
        engine_dir=engine_dir.resolve(),
        tokenizer_dir=tokenizer_dir.resolve(),
        engine=engine,
        options=options,
        labels={"engine": engine.kind, "source": source},
        route=route,
        source=source,
        loras=adapters,
        warnings=warnings,
        vision=vision,
        processor=processor,
    )


def check_tag(name: str, version: str | None = None) -> None:
    from bentoml._internal.tag import Tag

    try:
        Tag(name, version)
    except ValueError as error:
        raise PackError(f"invalid model name/tag {name}:{version or ''}: {error}") from error


def _check_loras(engine: EngineInfo, loras: Mapping[str, Path]) -> dict[str, Path]:
    if loras and engine.kind == "tensorrt_llm" and not engine.lora_enabled:
        raise PackError(
            "LoRA adapters given, but the engine was built without the LoRA plugin: rebuild it "
            "with trtllm-build --lora_plugin <dtype> --lora_dir ... (or drop --lora)"
        )
    checked = {}
    for name, path in loras.items():
        try:
            check_name(name)
            check_adapter_dir(Path(path))
        except LoraError as error:
            raise PackError(str(error)) from error
        checked[name] = Path(path).resolve()
    return checked


def _link_or_copy(src: Path, dst: Path, progress: tqdm | None) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)  # same filesystem: instant, no extra disk
    except OSError:
        with src.open("rb") as reader, dst.open("wb") as writer:
            while chunk := reader.read(8 << 20):
                writer.write(chunk)
                if progress is not None:
                    progress.update(len(chunk))
        shutil.copystat(src, dst)
        return
    if progress is not None:
        progress.update(src.stat().st_size)


def copy_files(
    files: list[tuple[Path, Path]], root: Path, desc: str, show_progress: bool = True
) -> None:
    """Hard-link (one filesystem) or copy each (source file, path inside the model) under root,
    with one progress bar in bytes."""
    with tqdm(
        total=sum(src.stat().st_size for src, _ in files),
        unit="B",
        unit_scale=True,
        desc=desc,
        disable=not show_progress,
    ) as progress:
        for src, rel in files:
            _link_or_copy(src, root / rel, progress)


def write_model_tree(pack: PackPlan, root: Path, show_progress: bool = True) -> None:
    """Write engines, tokenizer, the filled repository and the manifest under root."""
    copy_files(pack.files(), root, "engines+tokenizer", show_progress)
    record_tokenizer_class(root / TOKENIZER)
    if pack.options.get("xgrammar_tokenizer_info_path") == XGRAMMAR_TOKENIZER_INFO:
        write_tokenizer_info(root / TOKENIZER, root / XGRAMMAR_TOKENIZER_INFO)
    fill_repository(root / REPOSITORY, pack.options)
    (root / MANIFEST).write_text(json.dumps(pack.manifest(), indent=2) + "\n")


class StorablePlan(Protocol):
    """What store() needs of a plan (engines: PackPlan; checkpoints: llmapi_packing.LlmapiPlan)."""

    name: str
    labels: dict[str, str]

    def metadata(self) -> dict[str, Any]: ...

    def write_tree(self, root: Path, show_progress: bool = True) -> None: ...


def store(pack: StorablePlan, version: str | None = None, show_progress: bool = True) -> str:
    """Store the plan in the BentoML model store; returns the tag. All or nothing.

    ``bentoml.models.create`` stages a model in a temp dir and then *copies* it into the store,
    which would copy every engine byte once more. This does what its save step does — register
    the tag, write model.yaml — but writes straight into the store, hard-linking engines when on
    the same filesystem. The directory is removed on any error or Ctrl-C, and model.yaml (which
    makes the model visible) is written last.
    """
    import bentoml
    from bentoml._internal.configuration.containers import BentoMLContainer
    from bentoml._internal.models.model import Model, ModelContext
    from bentoml._internal.tag import Tag

    check_tag(pack.name, version)
    tag = Tag(pack.name, version) if version else Tag(pack.name).make_new_version()
    try:
        bentoml.models.get(str(tag))
    except bentoml.exceptions.NotFound:
        pass
    else:
        raise PackError(f"model {tag} already exists in the model store: pass another --tag")
    model = Model.create(
        tag,
        module="",
        api_version="v1",
        signatures={},
        labels=pack.labels,
        metadata=pack.metadata(),
        context=ModelContext(framework_name="", framework_versions={}),
    )
    model_store = BentoMLContainer.model_store.get()
    name_dir: Path | None = None
    try:
        with model_store.register(tag) as target:
            root = Path(target)
            name_dir = root.parent
            try:
                pack.write_tree(root, show_progress)
                with (root / "model.yaml").open("w", encoding="utf8") as model_yaml:
                    model.info.dump(model_yaml)
            except Exception:
                raise  # register() removes the directory
            except BaseException:  # Ctrl-C: register() only cleans up after an Exception
                shutil.rmtree(root, ignore_errors=True)
                raise
    except BaseException:
        if name_dir is not None:
            with contextlib.suppress(OSError):
                name_dir.rmdir()  # left empty when this was the name's only version
        raise
    return str(tag)


@contextmanager
def staging_dir(prefix: str) -> Iterator[Path]:
    """A scratch directory for CPU engines built at pack time; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
