"""The README and docs/ stay true to the tree: relative links lead to files and headings that
exist, every `TRTLLM_*` name they mention is a setting or is used in the code, the README stays a
short landing page that opens with the two set-up commands, docs/performance.md stays a short
page of method and current figures, and every dated run under docs/results/runs/ is indexed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tensorrtllm_backend.settings import STUB_VARIABLES, Settings, env_name

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]  # with docs/results/
# Where a variable counts as used: the code, scripts, benchmarks and tests (not this module).
CODE_PLACES = (
    "tensorrtllm_backend",
    "service.py",
    "pack_model.py",
    "scripts",
    "benchmarks",
    "tests",
)
CODE_SUFFIXES = {".py", ".sh", ".pbtxt", ".yaml", ".yml", ".toml"}
README_MAX_LINES = 250
PERFORMANCE = ROOT / "docs" / "performance.md"
PERFORMANCE_MAX_LINES = 300  # method and current figures; dated runs go to docs/results/
RESULTS_INDEX = ROOT / "docs" / "results" / "README.md"
RUNS = ROOT / "docs" / "results" / "runs"
SETUP_COMMANDS = [
    "./scripts/serve-demo.sh   # 1. install into .venv, pack the CPU demo model, serve it on 127.0.0.1:3000",
    "./scripts/test.sh         # 2. install into .venv, lint, run all tests (real tritonserver + bentoml serve)",
]

FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
VARIABLE = re.compile(r"\bTRTLLM_[A-Z0-9_*]*[A-Z0-9*]")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lowercased, without punctuation other than `-`
    and `_`, spaces turned into `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor, duplicates numbered as GitHub does (`x`, `x-1`, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", markdown)):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(markdown: str) -> list[str]:
    """Targets of the Markdown links outside code blocks and code spans."""
    prose = INLINE_CODE.sub("", FENCE.sub("", markdown))
    return LINK.findall(prose)


def broken_links(page: Path, markdown: str) -> list[str]:
    """Relative links of `page` whose file, or heading in that file, does not exist."""
    problems = []
    for target in links(markdown):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http(s), mailto, ...
            continue
        path_part, _, anchor = target.partition("#")
        if not path_part:  # a heading of this page
            if anchor not in anchors(markdown):
                problems.append(f"{page.name}: {target} (no heading #{anchor} in {page.name})")
            continue
        file = (page.parent / path_part).resolve()
        if not file.exists():
            problems.append(f"{page.name}: {target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            problems.append(f"{page.name}: {target} (no heading #{anchor} in {file.name})")
    return problems


def code_variables() -> set[str]:
    names = {env_name(field) for field in Settings.model_fields} | set(STUB_VARIABLES)
    for place in CODE_PLACES:
        path = ROOT / place
        files = [path] if path.is_file() else path.rglob("*")
        for file in files:
            if file.suffix in CODE_SUFFIXES and file.resolve() != Path(__file__).resolve():
                text = file.read_text(encoding="utf-8", errors="replace")
                names |= set(re.findall(r"\bTRTLLM_[A-Z0-9_]*[A-Z0-9]", text))
    return names


def unknown_variables(markdown: str, known: set[str]) -> list[str]:
    """`TRTLLM_*` names in `markdown` that nothing in the code uses; `TRTLLM_TRITON_*_PORT`
    stands for the names it matches, and must match one."""
    unknown = []
    for name in sorted(set(VARIABLE.findall(markdown))):
        if "*" in name:
            pattern = re.compile(re.escape(name).replace(r"\*", "[A-Z0-9_]*") + "$")
            if not any(pattern.match(known_name) for known_name in known):
                unknown.append(name)
        elif name not in known:
            unknown.append(name)
    return unknown


def test_the_readme_is_a_short_landing_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_performance_page_stays_short() -> None:
    lines = PERFORMANCE.read_text().splitlines()
    assert len(lines) <= PERFORMANCE_MAX_LINES, (
        f"docs/performance.md has {len(lines)} lines: move dated runs to docs/results/runs/"
    )


def test_every_dated_run_is_listed_in_the_results_index() -> None:
    runs = sorted(RUNS.glob("*.md"))
    assert runs, "no dated runs under docs/results/runs/"
    index = links(RESULTS_INDEX.read_text())
    assert [run.name for run in runs if f"runs/{run.name}" not in index] == []
    assert all(re.match(r"\d{4}-\d{2}-\d{2}-", run.name) for run in runs)


def test_the_readmes_first_commands_are_the_two_setup_commands() -> None:
    first_bash = re.search(r"^```bash\n(.*?)^```", README.read_text(), re.M | re.S)
    assert first_bash is not None, "README.md has no bash block"
    assert first_bash.group(1).splitlines() == SETUP_COMMANDS


@pytest.mark.parametrize("page", DOCS, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_lead_to_existing_files_and_headings(page: Path) -> None:
    assert broken_links(page, page.read_text()) == []


@pytest.mark.parametrize("page", DOCS, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_variable_named_is_used_in_the_code(page: Path) -> None:
    assert unknown_variables(page.read_text(), code_variables()) == []


def test_docs_paths_named_in_prose_exist() -> None:
    """`docs/x.md` written out in the README or docs/ (not as a link) names a real page."""
    missing = [
        f"{page.name}: {name}"
        for page in DOCS
        for name in re.findall(r"\bdocs/[\w./-]*\w\.md\b", page.read_text())
        if not (ROOT / name).exists()
    ]
    assert missing == []


# The checks themselves: what they must catch.


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("How it fits together", "how-it-fits-together"),
        (
            "The LLM API workflow (`--workflow llmapi`, recommended)",
            "the-llm-api-workflow---workflow-llmapi-recommended",
        ),
        ("Figures: GPU host (H100, 16 cores)", "figures-gpu-host-h100-16-cores"),
        ("`benchmarks/ab.py`: a/b", "benchmarksabpy-ab"),
        ("OpenAI's Responses API", "openais-responses-api"),
        ("snake_case and BentoML × TensorRT-LLM", "snake_case-and-bentoml--tensorrt-llm"),
    ],
)
def test_anchors_follow_githubs_rule(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_repeated_headings_are_numbered_and_code_blocks_hold_none() -> None:
    text = "# Title\n## Part\n## Part\n```bash\n# a comment, not a heading\n```\n"
    assert anchors(text) == {"title", "part", "part-1"}


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n## A section\n")
    page = tmp_path / "page.md"
    text = (
        "# Page\n[ok](other.md) [ok](other.md#a-section) [ok](#page) [web](https://x.y/z#q)\n"
        "`[in code](gone.md)`\n```\n[in a block](gone.md)\n```\n"
    )
    assert broken_links(page, text) == []
    assert broken_links(page, text + "[renamed](gone.md)\n") == ["page.md: gone.md (no such file)"]
    assert broken_links(page, text + "[moved](other.md#b-section)\n") == [
        "page.md: other.md#b-section (no heading #b-section in other.md)"
    ]
    assert broken_links(page, text + "[here](#nowhere)\n") == [
        "page.md: #nowhere (no heading #nowhere in page.md)"
    ]


def test_an_unknown_variable_is_found() -> None:
    known = {"TRTLLM_WORKERS", "TRTLLM_TRITON_GRPC_PORT"}
    text = "`TRTLLM_WORKERS`, `TRTLLM_TRITON_*_PORT`, every `TRTLLM_*` variable"
    assert unknown_variables(text, known) == []
    assert unknown_variables(text + ", `TRTLLM_WORKER`", known) == ["TRTLLM_WORKER"]
    assert unknown_variables("`TRTLLM_LLMAPI_*`", known) == ["TRTLLM_LLMAPI_*"]


def test_the_known_variables_include_the_settings_and_the_stubs() -> None:
    known = code_variables()
    assert {env_name(field) for field in Settings.model_fields} <= known
    assert set(STUB_VARIABLES) <= known
    assert "TRTLLM_NOT_A_SETTING" not in known


def test_the_docs_list_every_path_the_api_key_leaves_open() -> None:
    """docs/configuration.md's TRTLLM_API_KEY row names exactly the registry's open paths."""
    from tensorrtllm_backend.serving.apis import APIS

    row = next(
        line
        for line in (ROOT / "docs" / "configuration.md").read_text().splitlines()
        if line.startswith("| `TRTLLM_API_KEY`")
    )
    listed = set(re.findall(r"`(/[a-z_/.]*)`", row.split("stay open")[0].split("pages")[-1]))
    assert listed == {api.path for api in APIS if api.open}
