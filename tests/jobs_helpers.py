"""Shared helpers for the jobs tests: stack outputs from the fixture files."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "outputs"
STACKS = ("dev", "prod")


def outputs_file(stack: str) -> Path:
    return FIXTURES / f"{stack}.json"


def outputs_doc(stack: str) -> dict:
    return json.loads(outputs_file(stack).read_text())


def stack_outputs(stack: str):
    from amlhpc.jobs.plan import outputs

    return outputs.load(stack, outputs_file=outputs_file(stack)).outputs
