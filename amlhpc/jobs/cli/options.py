"""What every `python -m amlhpc.jobs` command shares: its options, consoles, error guard and the
stack-outputs loader. Imported by amlhpc/jobs/cli/main.py and the sub-apps it mounts (data, beeond,
run), so none of them imports another's CLI module.

Which value wins when several set the same thing: a command-line flag beats `--set`,
`--set` beats the recipe file, the recipe beats the stack's defaults (e.g. --nodes >
--set nodes= > recipe nodes).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from amlhpc.core.errors import exit_on_bad_input
from amlhpc.core.values import NumberError, check_number, check_run_name

out = Console()
err = Console(stderr=True)


def number(kind: str) -> Callable[[Any], Any]:
    """A typer callback that passes a number of amlhpc.core.values.RANGES[kind] through and refuses
    NaN, infinities and absurd values with click's usage error (exit 2, the range named)."""

    def callback(value: Any) -> Any:
        if value is None:
            return None
        try:
            return check_number(value, kind)
        except NumberError as exc:
            raise typer.BadParameter(str(exc)) from None

    return callback


def _run_name(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_run_name(value, "job name")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


Stack = Annotated[str, typer.Option("--stack", help="Stack whose outputs name the workspace, clusters and storage.")]
Offline = Annotated[bool, typer.Option("--offline", help="Use the offline plan of Pulumi.<stack>.yaml instead of the deployed stack.")]
OutputsFile = Annotated[Path | None, typer.Option("--outputs", help="Stack outputs from a JSON file (`pulumi stack output --json`); wins over the deployed stack.")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of the short error block.")]
ClusterOpt = Annotated[str | None, typer.Option("--cluster", help="Cluster to run on; wins over the recipe's `cluster` (default: the stack's first InfiniBand cluster).")]
NodesOpt = Annotated[int | None, typer.Option("--nodes", callback=number("nodes"),
                                               help="Nodes; wins over --set nodes= and the recipe's `nodes`.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help="Override a recipe key, e.g. --set inputs.cosmoflow.mode=download; wins over the recipe file.")]
AllowTcp = Annotated[bool, typer.Option("--allow-tcp", help="Allow several nodes of a size without InfiniBand (TCP only, scales badly).")]
JobName = Annotated[str, typer.Argument(help="Job name, as printed by submit.")]
HoursOpt = Annotated[float | None, typer.Option("--hours", callback=number("hours"),
                                                 help="Expected wall-clock hours for the cost check (and the job's timeout); wins over the recipe's cost.expected_hours.")]
ResumeOpt = Annotated[str | None, typer.Option("--resume", callback=_run_name,
                                                help="Resume from the checkpoints of this earlier job (its name, as submit printed it).")]

OptionalStack = Annotated[str | None, typer.Option("--stack", help="Stack whose Azure ML workspace holds the run (not "
                                                   "needed with --local).")]
LocalRuns = Annotated[bool, typer.Option("--local", help="This project's rehearsals (.rehearsal/) instead of the "
                                         "stack's Azure ML workspace.")]
RunName = Annotated[str, typer.Argument(help="A job or managed run as submit printed it, or a rehearsal's --name "
                                        "(with --local).")]

T = TypeVar("T")


def print_json(document: Any) -> None:
    """Data for scripts, on stdout, nothing else there."""
    import json
    import sys

    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def guard(debug: bool, body: Callable[[], T]) -> T:
    """Run a command's body: bad input prints one error block and exits 2 (traceback with --debug)."""
    with exit_on_bad_input(debug):
        return body()


def need_stack(stack: str | None, local: bool) -> str:
    """--stack, required unless --local (this project's rehearsals) is given."""
    from amlhpc.core.errors import Problem, UserError

    if stack is None and not local:
        raise UserError([Problem("command line", "--stack", "names the workspace to ask",
                                 "add --stack S for the stack's Azure ML runs, or --local for this project's rehearsals")],
                        "missing option")
    return stack or ""


def load_outputs(stack: str, offline: bool, outputs_file: Path | None, offline_allowed: bool = True) -> Any:
    """The stack's validated outputs (amlhpc.core.outputs.StackOutputs) from the chosen source
    (`offline_allowed` False: a command that asks Azure ML, whose fixes never suggest --offline)."""
    from amlhpc.jobs.plan import outputs

    return outputs.load(stack, outputs_file=outputs_file, offline=offline, offline_allowed=offline_allowed).outputs
