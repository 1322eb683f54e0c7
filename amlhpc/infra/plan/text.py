"""Plain-text layout for plans and plan diffs: 80 columns, words never split.

Text goes to terminals, CI logs and pull-request comments alike, so it is laid out once,
for a fixed width (the same bytes whatever the terminal), without tables or colour: a
long name or value stays whole on its own line rather than being cut mid-word.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

WIDTH = 80
INDENT = "  "
DETAIL = "      "


def wrap(text: str, indent: str = "", subsequent: str | None = None, width: int = WIDTH) -> list[str]:
    """`text` filled to `width` at spaces only; a word longer than a line keeps its own line."""
    return textwrap.wrap(text, width=width, initial_indent=indent,
                         subsequent_indent=indent if subsequent is None else subsequent,
                         break_long_words=False, break_on_hyphens=False) or [indent.rstrip()]


def pair(left: str, right: str, indent: str = INDENT, continuation: str = DETAIL) -> list[str]:
    """`left  right` on one line when it fits, else `right` on the next line."""
    line = f"{indent}{left}  {right}" if right else f"{indent}{left}"
    if len(line) <= WIDTH or not right:
        return [line]
    return [f"{indent}{left}", f"{continuation}{right}"]


def value(v: Any) -> str:
    """A value as JSON, on one line (strings quoted, so "" and a missing value differ)."""
    return json.dumps(v, sort_keys=True, ensure_ascii=False)


def money(v: float | None, unit: str = "") -> str:
    return "n/a" if v is None else f"${v:,.2f}{unit}"


def signed_money(v: float, unit: str = "") -> str:
    return f"{'+' if v >= 0 else '-'}${abs(v):,.2f}{unit}"


def price_fix(skus: tuple[str, ...]) -> str:
    """What makes an unpriced size priced."""
    return "set " + " and ".join(f"aml-hpc:prices.{s}" for s in skus) + " in the stack file"
