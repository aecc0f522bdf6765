"""The loop parts' declarations as the guide's Markdown table: ``python -m
jaxrl_llm.training.parts.table`` prints it, ``--write`` puts it into docs/guide.md between its
markers."""

from __future__ import annotations

import sys
from pathlib import Path

from jaxrl_llm.training.parts.base import conflict_table
from jaxrl_llm.training.parts.registry import part_classes

BEGIN, END = "<!-- loop-parts-table -->", "<!-- /loop-parts-table -->"


def table() -> str:
    return conflict_table(part_classes())


def with_table(text: str) -> str:
    """``text`` (the guide) with the table between its markers replaced by the current one."""
    i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:i] + "\n" + table() + "\n" + text[j:]


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        guide = Path(__file__).parents[3] / "docs" / "guide.md"
        guide.write_text(with_table(guide.read_text()))
    else:
        print(table())
