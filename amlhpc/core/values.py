"""One rule for the numbers and run names a user types: finite, in a sane range, named in the error.

Python's float() takes "nan", "inf" and "1e400" (which is inf) without complaint, and so do
click and pydantic; a cost of `$nan` then compares as "within the ceiling" and `int(inf)`
raises OverflowError deep inside a command. Every place that reads a number from a person
(CLI options in amlhpc/jobs/cli/options.py, the recipe schema, the stack config) goes through
`check_number`, so the refusal reads the same everywhere: the value, what it is, the range.

`RANGES` holds the ranges that are not obvious from the unit, each with the reason for its
upper bound (an "absurd" value is one no real job or stack can have, so it is a typo).
`run_name` checks a job/run name used as a path part (checkpoint prefixes, managed-run
records): a plain name, never a path. Pure: standard library and pydantic only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator


@dataclass(frozen=True)
class Range:
    """Allowed values of one kind of number, and why the upper bound is where it is."""

    what: str
    minimum: float
    maximum: float
    exclusive_minimum: bool = False
    integer: bool = False
    why_maximum: str = ""
    exclusive_maximum: bool = False

    def describe(self) -> str:
        low = f"> {self.minimum:g}" if self.exclusive_minimum else f">= {self.minimum:g}"
        high = f"< {self.maximum:g}" if self.exclusive_maximum else f"<= {self.maximum:g}"
        kind = "a whole number" if self.integer else "a finite number"
        return f"{kind} {low} and {high}" + (f" ({self.why_maximum})" if self.why_maximum else "")


RANGES: dict[str, Range] = {
    "hours": Range("hours", 0, 24 * 366, exclusive_minimum=True,
                   why_maximum="a year: no Azure ML job runs longer"),
    "usd": Range("US dollars", 0, 1e9, exclusive_minimum=True, why_maximum="a billion dollars"),
    "usd_per_hour": Range("US dollars per node-hour", 0, 10_000, exclusive_minimum=True,
                          why_maximum="no Azure VM size costs more than $10,000 an hour"),
    "params": Range("parameters", 1, 1e15, integer=True,
                    why_maximum="a quadrillion parameters: 1,000x the largest published model"),
    "gpus": Range("GPUs", 1, 1_000_000, integer=True, why_maximum="a million GPUs"),
    "gpu_gib": Range("GiB of GPU memory", 0, 4096, exclusive_minimum=True,
                     why_maximum="4 TiB: 14x the largest GPU memory shipped (288 GB, GB300)"),
    "nodes": Range("nodes", 1, 10_000, integer=True, why_maximum="an AmlCompute cluster is far smaller"),
    "gbits_per_s": Range("Gb/s", 0, 100_000, exclusive_minimum=True, why_maximum="100 Tb/s"),
    "mbits_per_s": Range("Mb/s", 0, 100_000_000, exclusive_minimum=True, why_maximum="100 Tb/s"),
    "mib": Range("MiB", 0, 1 << 30, exclusive_minimum=True, why_maximum="a pebibyte"),
    "model_dim": Range("model dimension", 1, 1 << 24, integer=True,
                       why_maximum="16 Mi: larger than any transformer's hidden size, vocabulary or context"),
    "per_node_hour": Range("interruptions per node-hour", 0, 1, exclusive_maximum=True,
                           why_maximum="one per node-hour or more means a node rarely lives an hour: no checkpoint "
                                       "interval gets work done; measured rates are a few per thousand node-hours"),
    "per_gpu_hour": Range("interruptions per GPU-hour", 0, 1, exclusive_maximum=True,
                          why_maximum="one per GPU-hour or more: no job of several GPUs would get work done; Llama 3's "
                                      "was 2e-5"),
    "checkpoint_gb": Range("GB per checkpoint", 0, 1e6, exclusive_minimum=True,
                           why_maximum="a petabyte: 60x the state of a trillion-parameter model"),
    "batch": Range("batch size", 1, 1 << 20, integer=True, why_maximum="a million samples per step"),
}


class NumberError(ValueError):
    """A number outside its range; the message names the value and the range."""


def check_number(value: Any, kind: str | Range) -> float | int:
    """`value` as a number within `kind`'s range (a RANGES key or a Range); NumberError otherwise.

    Accepts ints, floats and numeric strings (a CLI's text); refuses bools, NaN, infinities and
    anything outside the range, with the value and the allowed range in the message.
    """
    rule = RANGES[kind] if isinstance(kind, str) else kind
    shown = repr(value) if not isinstance(value, str) else value
    if isinstance(value, bool):
        raise NumberError(f"{shown} is not a number; {rule.what} must be {rule.describe()}")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise NumberError(f"{shown!r} is not a number; {rule.what} must be {rule.describe()}") from None
    if not isinstance(value, int | float):
        raise NumberError(f"{shown} is not a number; {rule.what} must be {rule.describe()}")
    if isinstance(value, float) and not math.isfinite(value):
        raise NumberError(f"{shown} is not a finite number; {rule.what} must be {rule.describe()}")
    too_low = value <= rule.minimum if rule.exclusive_minimum else value < rule.minimum
    too_high = value >= rule.maximum if rule.exclusive_maximum else value > rule.maximum
    if too_low or too_high:
        raise NumberError(f"{shown} is out of range; {rule.what} must be {rule.describe()}")
    if rule.integer:
        if isinstance(value, float) and not value.is_integer():
            raise NumberError(f"{shown} is not a whole number; {rule.what} must be {rule.describe()}")
        return int(value)
    return float(value)


def _checked(kind: str):
    def validate(value: Any) -> Any:
        if value is None:
            return None
        return check_number(value, kind)
    return validate


def checked(kind: str) -> AfterValidator:
    """The pydantic validator of a field that holds a RANGES[kind] number (None passes through):
    `Annotated[float, checked("hours")]` (int for the integer ranges)."""
    return AfterValidator(_checked(kind))


Hours = Annotated[float, checked("hours")]
Usd = Annotated[float, checked("usd")]
UsdPerHour = Annotated[float, checked("usd_per_hour")]
Gbps = Annotated[float, checked("gbits_per_s")]
Nodes = Annotated[int, checked("nodes")]


# --------------------------------------------------------------------------------------
# Run names

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,254}$")
"""Azure ML's job name rule (letters, digits, '-' and '_', starting with a letter or digit,
at most 255 characters): a name, so it can never climb out of a blob prefix or folder."""


def check_run_name(value: str, what: str = "run name") -> str:
    """`value` when it is a plain job/run name; NumberError-like ValueError naming why not."""
    if not isinstance(value, str) or not RUN_NAME.match(value):
        raise ValueError(f"{value!r} is not a plain {what}: use the job's name as `submit` printed it "
                         "(letters, digits, '-' and '_', no '/', '.' or spaces)")
    return value
