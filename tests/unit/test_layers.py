"""The package's layers (tensorrtllm_backend.ALLOWED_IMPORTS) hold: every import of every module,
at module level or inside a function, goes to its own layer or to one the table allows."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tensorrtllm_backend import ALLOWED_IMPORTS

PACKAGE = Path(__file__).resolve().parents[2] / "tensorrtllm_backend"


def imported_modules(source: str, module: str, is_package: bool) -> list[str]:
    """Absolute names of what `source` (the text of `module`) imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                base = parts[: len(parts) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from . import x` may name a module: count each imported name as one.
            found += [prefix] if node.module else [f"{prefix}.{a.name}" for a in node.names]
    return found


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "tensorrtllm_backend" or len(parts) < 2:
        return None
    return parts[1]


def module_of(path: Path) -> tuple[str, bool]:
    """The dotted name of the module at `path`, and whether it is a package's __init__."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    is_package = path.name == "__init__.py"
    return (module.removesuffix(".__init__") if is_package else module), is_package


def violations(path: Path, source: str) -> list[str]:
    module, is_package = module_of(path)
    own = layer_of(module)
    if own is None:
        return []
    allowed = ALLOWED_IMPORTS[own] | {own}
    return [
        f"{module} imports {target}"
        for target in imported_modules(source, module, is_package)
        if (layer := layer_of(target)) is not None and layer not in allowed
    ]


def test_every_layer_is_listed() -> None:
    layers = {
        p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    layers |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.rglob("*.py"))}
    layers -= {"__init__", "__pycache__"}
    assert layers == set(ALLOWED_IMPORTS)


def test_no_module_imports_across_a_forbidden_layer() -> None:
    found = [
        problem
        for path in sorted(PACKAGE.rglob("*.py"))
        for problem in violations(path, path.read_text(encoding="utf-8"))
    ]
    assert found == []


@pytest.mark.parametrize(
    ("where", "line"),
    [
        (
            "all_models/inflight_batcher_llm/tensorrt_llm/1/model.py",
            "from tensorrtllm_backend.serving.schemas import X",
        ),
        ("python_models/cpu_engine/hf.py", "from ...serving import generation"),
        ("triton/client.py", "from ..serving.engine_api import InferenceEngine"),
        ("common/guides.py", "def f():\n    from ..triton import client"),
        ("packing/demo.py", "import tensorrtllm_backend.serving.runtime"),
    ],
)
def test_a_forbidden_import_is_found(where: str, line: str) -> None:
    """The check itself: a forbidden import added anywhere in a module fails it."""
    path = PACKAGE / where
    assert violations(path, path.read_text(encoding="utf-8")) == []
    assert violations(path, path.read_text(encoding="utf-8") + "\n" + line + "\n") != []


# Inside the BentoML worker: each API is a package of its own (protocol + renderer) over the chat
# core; the core and the HTTP plumbing every API shares know none of them.
SERVING = PACKAGE / "serving"
API_PACKAGES = frozenset({"native_api", "openai_api", "responses_api", "anthropic_api", "vllm_api"})
NEUTRAL_PACKAGES = frozenset({"chat", "web"})


def serving_package(module: str) -> str | None:
    """The serving subpackage a module belongs to (None: a module of serving itself)."""
    parts = module.split(".")
    if parts[:2] != ["tensorrtllm_backend", "serving"] or len(parts) < 3:
        return None
    return parts[2]


def api_violations(path: Path, source: str) -> list[str]:
    module, is_package = module_of(path)
    own = serving_package(module)
    if own not in API_PACKAGES | NEUTRAL_PACKAGES:
        return []
    found = []
    for target in imported_modules(source, module, is_package):
        other = serving_package(target)
        if other in API_PACKAGES and other != own:
            found.append(f"{module} imports {target}")
    return found


def test_api_packages_never_import_each_other_and_the_core_imports_none() -> None:
    assert {p.name for p in SERVING.iterdir() if (p / "__init__.py").exists()} >= (
        API_PACKAGES | NEUTRAL_PACKAGES
    )
    found = [
        problem
        for path in sorted(SERVING.rglob("*.py"))
        for problem in api_violations(path, path.read_text(encoding="utf-8"))
    ]
    assert found == []


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("anthropic_api/messages.py", "from ..openai_api.serving import OpenAIServing"),
        ("responses_api/serving.py", "from ..anthropic_api import protocol"),
        ("chat/core.py", "def f():\n    from ..openai_api import protocol"),
        ("chat/stream.py", "import tensorrtllm_backend.serving.responses_api.store"),
        ("web/endpoints.py", "from ..vllm_api.tokenize import tokenize"),
    ],
)
def test_an_import_between_apis_is_found(where: str, line: str) -> None:
    path = SERVING / where
    assert api_violations(path, path.read_text(encoding="utf-8")) == []
    assert api_violations(path, path.read_text(encoding="utf-8") + "\n" + line + "\n") != []
