"""Bad-input errors for the in-job runtime, shaped like `amlhpc.core.errors` (which the runtime
cannot import: it ships alone into the training image).

A `RuntimeInputError` holds every `RuntimeProblem` found in one input (an environment
variable such as AMLHPC_SKU_JSON, a flag, a file): where it came from, which key, what is
wrong with which value, and how to fix it. Entry points print `render()` to stderr and
exit with `ExitCode.USAGE` (exit_codes.py). Values that may be secrets are never put in a message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self


@dataclass(frozen=True)
class RuntimeProblem:
    """One thing wrong: `reference` (variable or file), `path` (key inside it), message, hint."""

    reference: str
    path: str
    message: str
    hint: str = ""

    def render(self) -> str:
        where = f"{self.reference}: {self.path}" if self.path else self.reference
        text = f"{where}: {self.message}"
        if self.hint:
            text += f"\n    fix: {self.hint}"
        return text


class RuntimeInputError(Exception):
    """Bad input to a runtime entry point, with every problem found."""

    def __init__(self, problems: list[RuntimeProblem], title: str = "invalid runtime input"):
        self.problems = list(problems)
        self.title = title
        super().__init__(self.render())

    @classmethod
    def single(cls, reference: str, path: str, message: str, hint: str = "") -> Self:
        return cls([RuntimeProblem(reference, path, message, hint)])

    def render(self) -> str:
        count = len(self.problems)
        head = f"{self.title} ({count} problem{'s' if count != 1 else ''}):"
        lines = ["  - " + p.render().replace("\n", "\n  ") for p in self.problems]
        return "\n".join([head, *lines])

    def __str__(self) -> str:
        return self.render()


def load_json_object(text: str, reference: str, hint: str) -> Mapping[str, Any]:
    """Parse `text` (the value of `reference`) as a JSON object, or raise RuntimeInputError."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RuntimeInputError.single(
            reference, "", f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", hint) from None
    if not isinstance(data, Mapping):
        raise RuntimeInputError.single(reference, "", f"must be a JSON object, got {type(data).__name__}", hint)
    return data
