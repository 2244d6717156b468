"""Fill one config.pbtxt template from the command line, with NVIDIA's fill_template.py syntax.

    python -m tensorrtllm_backend.packing.fill_template -i <model>/config.pbtxt key:value,key:value

Commands written for NVIDIA's tool work unchanged: ``-i``/``--in_place`` edits the file, without it
the result goes to stdout; items are separated by ``,`` and ``\\`` escapes a ``,`` or ``:`` inside
a value (``gpu_device_ids:0\\,1``). Differences, all stricter or more lenient in the safe
direction: the key ends at the first unescaped ``:`` (NVIDIA rejects a second one), unset
placeholders get the defaults of ``repository.DEFAULTS``, and a key the template lacks, a leftover
placeholder or a result that does not parse as a ModelConfig fails with exit code 2 and a one-line
message, leaving the file untouched.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

if not __package__:  # run as a script: make the package importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tensorrtllm_backend.common.model_repository import TemplateError, parse_config
from tensorrtllm_backend.packing.repository import MODEL_NAMES, fill_template

EXIT_USAGE = 2
_NAME_LINE = re.compile(r'^\s*name\s*:\s*"([^"]+)"', re.MULTILINE)


def _split_escaped(text: str, sep: str, maxsplit: int = -1, keep: str = "") -> list[str]:
    """Split on unescaped ``sep``; a backslash keeps the next character literally (as NVIDIA's).

    Escapes of the characters in ``keep`` stay escaped in the parts, for a second split.
    """

    def literal(char: str) -> str:
        return "\\" + char if char in keep else char

    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            current.append(literal(char))
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == sep and (maxsplit < 0 or len(parts) < maxsplit):
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if escaped:  # a trailing backslash is itself
        current.append(literal("\\"))
    parts.append("".join(current))
    return parts


def parse_substitutions(spec: str) -> dict[str, str]:
    """``"a:1,b:x\\,y,c:"`` -> ``{"a": "1", "b": "x,y", "c": ""}``; the key ends at the first ':'."""
    values: dict[str, str] = {}
    if not spec.strip():
        return values
    # Items split on unescaped ',', keeping escapes of ':' for the key/value split.
    for item in _split_escaped(spec, ",", keep=":\\"):
        if not item.strip():
            continue
        pieces = _split_escaped(item, ":", maxsplit=1)
        if len(pieces) != 2 or not pieces[0].strip():
            raise TemplateError(f"substitution {item!r} is not of the form key:value")
        key, value = pieces[0].strip(), pieces[1]
        if key in values:
            raise TemplateError(f"key {key!r} is given twice")
        values[key] = value
    return values


def identify_model(path: Path, text: str) -> str:
    """The model a config belongs to: its folder name if known, else its ``name:`` field."""
    if path.resolve().parent.name in MODEL_NAMES:
        return path.resolve().parent.name
    match = _NAME_LINE.search(text)
    if match and match.group(1) in MODEL_NAMES:
        return match.group(1)
    raise TemplateError(
        f"cannot tell which model {path} is: its folder and name are none of "
        f"{', '.join(MODEL_NAMES)}; pass --model"
    )


def _write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` in one rename so a failure never leaves a half-written config."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other failure here
        self.exit(EXIT_USAGE, f"fill_template: error: {message}\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fill_template",
        description="Fill a TensorRT-LLM Triton config.pbtxt template (NVIDIA-compatible syntax).",
    )
    parser.add_argument("file_path", type=Path, help="the config.pbtxt to fill")
    parser.add_argument(
        "substitutions",
        nargs="?",
        default="",
        help="key:value,key:value... (escape ',' and ':' in values with a backslash)",
    )
    parser.add_argument("--in_place", "-i", action="store_true", help="rewrite the file in place")
    parser.add_argument("--model", choices=MODEL_NAMES, help="model to take defaults from")
    parser.add_argument(
        "--no-defaults",
        dest="use_defaults",
        action="store_false",
        help="do not fill unset placeholders with defaults (then every one must be given)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    path: Path = args.file_path
    try:
        try:
            text = path.read_text()
        except OSError as exc:
            raise TemplateError(f"cannot read {path}: {exc.strerror or exc}") from exc
        model = args.model or identify_model(path, text)
        values = parse_substitutions(args.substitutions)
        filled = fill_template(text, values, model=model, use_defaults=args.use_defaults)
        parse_config(filled, source=str(path))
        if args.in_place:
            _write_atomic(path, filled)
        else:
            sys.stdout.write(filled)
    except TemplateError as exc:
        print(f"fill_template: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
