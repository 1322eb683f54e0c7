"""`python -m amlhpc.jobs deepspeed-plan`: DeepSpeed's model-state memory per GPU for every ZeRO stage
and offload option, and the one aml-hpc would pick, from four numbers (no recipe, no stack).

    python -m amlhpc.jobs deepspeed-plan --params 70B --largest-layer 262M --gpus 8 --gpu-gib 40 [--json]

The figures are DeepSpeed's own estimators (amlhpc/jobs/plan/deepspeed.py says which, and from which
version); the choice is the fastest option whose model states fit in 90 % of the GPU's memory
(the rest is for the CUDA context, NCCL and fragmentation; activations come on top and depend
on the batch, so a recipe's plan adds them). `--json` prints

    {"options": [{"stage": 0-3, "offload_optimizer": bool, "offload_param": bool, "gib_per_gpu": float}, ...],
     "choice": {"stage", "offload_optimizer", "offload_param", "gib_per_gpu", "usable_gib_per_gpu", "reason"} | null}

Exit 0 with a choice, 1 when no option fits (choice null), 2 for bad input.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Annotated

import typer
from rich.table import Table

from amlhpc.core.errors import Problem, UserError
from amlhpc.core.values import NumberError, check_number
from amlhpc.jobs.cli.options import Debug, guard, out
from amlhpc.jobs.plan import deepspeed as ds

_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)\s*$")
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_count(text: str, flag: str) -> int:
    """"70B", "1.3b", "125M", "7e9" or "262144000" -> an integer count; UserError naming the flag
    (refused: not a number, NaN or infinite, below 1, or beyond amlhpc.core.values' parameter range)."""
    match = _COUNT.match(text)
    try:
        if not match:
            raise NumberError(f"{text!r} is not a positive parameter count")
        return int(check_number(float(match.group(1)) * _SCALE[match.group(2).lower()], "params"))
    except NumberError as exc:
        raise UserError([Problem("command line", flag, str(exc),
                                 "give a number, optionally with K, M, B or T: e.g. 70B, 1.3B, 125M or 7e9")],
                        "invalid deepspeed-plan input") from None


def plan(params: int, largest_layer: int, gpus: int, gpu_gib: float) -> dict:
    """The JSON document: every option, and the choice (or None)."""
    problems = []
    if largest_layer > params:
        problems.append(Problem("command line", "--largest-layer", f"{largest_layer:,} is more than --params {params:,}",
                                "the largest layer is one module's parameters, e.g. the embeddings (vocab x hidden)"))
    for flag, value, kind, hint in (("--gpus", gpus, "gpus", "give the total number of GPUs, 1 or more"),
                                    ("--gpu-gib", gpu_gib, "gpu_gib", "give the memory of one GPU in GiB, e.g. 40 or 80")):
        try:
            check_number(value, kind)
        except NumberError as exc:
            problems.append(Problem("command line", flag, str(exc), hint))
    if problems:
        raise UserError(problems, "invalid deepspeed-plan input")
    candidates = ds.options(params, largest_layer, gpus)
    usable = gpu_gib * ds.USABLE_GPU_MEMORY_FRACTION * ds.GIB
    start = ds.stage_by_size(params)
    chosen, why = ds.choose(candidates, usable, min_stage=start)
    choice = None
    if chosen is not None:
        reason = f"{params / 1e9:,.3g}B parameters start at ZeRO {start} (Azure's large-scale training guide)"
        if why:
            reason += "; " + "; ".join(why)
        choice = {**chosen.to_json(), "usable_gib_per_gpu": round(usable / ds.GIB, 3), "reason": reason}
    return {"options": [o.to_json() for o in candidates], "choice": choice}


def _print(document: dict, gpu_gib: float) -> None:
    table = Table("ZeRO stage", "offload optimizer", "offload parameters", "GiB per GPU", f"fits {gpu_gib:g} GiB")
    usable = gpu_gib * ds.USABLE_GPU_MEMORY_FRACTION
    for option in document["options"]:
        table.add_row(str(option["stage"]), "yes" if option["offload_optimizer"] else "no",
                      "yes" if option["offload_param"] else "no", f"{option['gib_per_gpu']:,.2f}",
                      "yes" if option["gib_per_gpu"] <= usable else "[red]no[/]")
    out.print(table)
    out.print("model states only (DeepSpeed's estimators); activations come on top", highlight=False)
    choice = document["choice"]
    if choice is None:
        out.print(f"[red]no option fits[/] in {usable:,.1f} GiB per GPU: add GPUs, or use GPUs with more memory")
        return
    offload = [n for n, on in (("optimizer", choice["offload_optimizer"]), ("parameters", choice["offload_param"])) if on]
    out.print(f"choice: ZeRO {choice['stage']}" + (f" with {' and '.join(offload)} offloaded to CPU" if offload else "")
              + f", {choice['gib_per_gpu']:,.2f} of {choice['usable_gib_per_gpu']:,.1f} GiB usable per GPU ({choice['reason']})",
              highlight=False, soft_wrap=True)


def deepspeed_plan(
    params: Annotated[str, typer.Option("--params", help="Total parameters, e.g. 70B, 1.3B, 125M or 7e9.")],
    largest_layer: Annotated[str, typer.Option("--largest-layer", help="Parameters of the largest layer (often the embeddings: vocab x hidden).")],
    gpus: Annotated[int, typer.Option("--gpus", help="Total GPUs (nodes x GPUs per node).")],
    gpu_gib: Annotated[float, typer.Option("--gpu-gib", help="Memory of one GPU, GiB (e.g. 40 or 80).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the options and the choice as JSON.")] = False,
    debug: Debug = False,
) -> None:
    """Model-state memory per GPU for each ZeRO stage and offload option (DeepSpeed's estimators), and the choice."""

    def body() -> dict:
        document = plan(parse_count(params, "--params"), parse_count(largest_layer, "--largest-layer"), gpus, gpu_gib)
        if as_json:
            sys.stdout.write(json.dumps(document, indent=2) + "\n")
        else:
            _print(document, gpu_gib)
        return document

    if guard(debug, body)["choice"] is None:
        raise typer.Exit(1)
