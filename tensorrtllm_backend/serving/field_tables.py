"""Every API's field table, and the docs that render them (docs/api.md, between a
``<!-- field-table: NAME -->`` and a ``<!-- end field-table -->`` line).

    python -m tensorrtllm_backend.serving.field_tables docs/api.md   # rewrite the tables there
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from .anthropic_api.fields import MESSAGES_FIELDS
from .field_policy import FieldTable
from .openai_api.fields import CHAT_FIELDS, COMPLETIONS_FIELDS
from .responses_api.fields import RESPONSES_FIELDS

TABLES: dict[str, FieldTable] = {
    "chat": CHAT_FIELDS,
    "completions": COMPLETIONS_FIELDS,
    "responses": RESPONSES_FIELDS,
    "messages": MESSAGES_FIELDS,
}
_BLOCK = re.compile(r"(<!-- field-table: (\w+) -->\n).*?(<!-- end field-table -->)", re.S)


def rendered(text: str) -> str:
    """`text` with every field table block filled from the tables."""

    def fill(match: re.Match[str]) -> str:
        return f"{match[1]}{TABLES[match[2]].markdown()}\n{match[3]}"

    return _BLOCK.sub(fill, text)


def main(argv: list[str]) -> int:
    for name in argv or ["docs/api.md"]:
        path = Path(name)
        path.write_text(rendered(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
