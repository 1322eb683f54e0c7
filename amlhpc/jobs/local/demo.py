"""`make demo`: the main job, offline, on embedded defaults - every step a user would type.

1. start Azurite (the local Blob service), with a fresh account and key;
2. the offline plan of the dev stack;
3. the cosmoflow job rendered for dev as Azure ML YAML (what `submit` would send);
4. a small synthetic CosmoFlow dataset in the real file naming;
5. `jobs data upload`: gzip-encoded into the stack's datasets container (Azurite);
6. `jobs run cosmoflow --local` on 2 simulated nodes x 2 ranks with the recipe's local
   profile (the model and dataset sizes of 4. and 6. come from `local:` in
   amlhpc/jobs/recipes/cosmoflow.yaml): staging, health gate, pinning, DDP training over gloo,
   checkpoints to Blob - the staging report, the loss per step and the checkpoint location
   are printed;
7. the same run name again with --resume, one epoch longer: it resumes from the checkpoint;
8. `jobs report`: the run's HTML report (loss, throughput, MFU, each node's step time, each
   node's CPU and memory (no GPU here), the staging and launch timeline, both attempts and
   what they would cost at the planned size), from what the run recorded;
9. stop Azurite; the last line says where the report is.

Each step runs the real command line in a subprocess; the demo stops at the first failure
with that step's exit status. Ctrl-C or SIGTERM stops the running step (which stops its
own processes), then Azurite; nothing is left running. Finishes in a few minutes on 2 cores.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time

from rich.console import Console

from amlhpc.core import project
from amlhpc.jobs.local import azurite, folders, processes
from amlhpc.jobs.report import REPORT_FILE
from amlhpc.jobs.runtime.base import contract

REPO_ROOT = project.root()
"""The project the demo runs in (the repository's own Pulumi.dev.yaml in a clone)."""
SCRATCH = project.scratch() / "demo"
RUN_NAME = "cosmoflow-demo"
RECIPE = "cosmoflow"

console = Console(highlight=False)
if not console.is_terminal:
    console.width = 100  # rules and wrapped lines as wide as a log reads well


def shown(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def step(number: int, title: str, argv: list[str], env: dict[str, str]) -> None:
    console.rule(f"[bold]{number}. {title}")
    console.print(f"[dim]$ {shown(argv)}[/]")
    started = time.monotonic()
    code = processes.run_step(argv, cwd=REPO_ROOT, env=env)
    if code != 0:
        console.print(f"[red]step {number} failed with exit status {code}[/]")
        raise SystemExit(code)
    console.print(f"[dim]({time.monotonic() - started:.1f} s)[/]")


def profile():
    """The cosmoflow recipe's local profile: the training command and dataset every rehearsal uses."""
    from amlhpc.jobs import recipes

    r = recipes.load(RECIPE, local=True)
    return r.command, r.local.data[RECIPE], r.inputs[RECIPE].path


def main() -> None:
    started = time.monotonic()
    py = sys.executable
    shutil.rmtree(SCRATCH, ignore_errors=True)
    shutil.rmtree(folders.REHEARSALS / RUN_NAME, ignore_errors=True)
    SCRATCH.mkdir(parents=True)
    env = {**os.environ, "COLUMNS": os.environ.get("COLUMNS", "160")}
    train, make_data, prefix = profile()

    console.rule("[bold]1. start Azurite (local Blob)")
    with azurite.start() as server:
        console.print(f"Azurite blob service at {server.blob_endpoint} (account {server.account}, generated key)")
        env[contract.BLOB_CONNECTION_STRING] = server.connection_string

        step(2, "offline plan of the dev stack", [py, "-m", "amlhpc.infra", "plan", "--stack", "dev"], env)

        job_yaml = SCRATCH / "cosmoflow-dev.yml"
        console.rule("[bold]3. the cosmoflow job for dev, as Azure ML YAML")
        argv = [py, "-m", "amlhpc.jobs", "submit", RECIPE, "--stack", "dev", "--offline", "--dry-run"]
        console.print(f"[dim]$ cd {SCRATCH.relative_to(REPO_ROOT)} && {shown(argv)} > {job_yaml.name}[/]")
        # printed where the file is saved: its code: path is relative to that folder
        with job_yaml.open("w") as sink:
            code = processes.run_step(argv, cwd=SCRATCH, env={**env, "PYTHONPATH": str(project.PACKAGE_ROOT)},
                                      stdout=sink)
        if code != 0:
            raise SystemExit(code)
        console.print(job_yaml.read_text(), markup=False)

        data = SCRATCH / "cosmoflow-data"
        generate = shlex.split(make_data.replace("{dir}", shlex.quote(str(data))))
        step(4, "a small synthetic CosmoFlow dataset (real naming, compressible volumes; the recipe's local profile)",
             [py, *generate[1:]] if generate[0] == "python" else generate, env)

        step(5, "upload it gzip-encoded to the dev stack's datasets container (Azurite)",
             [py, "-m", "amlhpc.jobs", "data", "upload", str(data), "--stack", "dev", "--offline", "--prefix", prefix,
              "--connection-string-env", contract.BLOB_CONNECTION_STRING], env)

        rehearse = [py, "-m", "amlhpc.jobs", "run", RECIPE, "--local", "--stack", "dev", "--nodes", "2",
                    "--procs-per-node", "2", "--name", RUN_NAME, "--quiet"]
        step(6, "rehearse cosmoflow with its local profile: 2 simulated nodes x 2 ranks (staging, health gate, "
                "DDP, checkpoints)", rehearse, env)
        step(7, "the same run again with --resume, one epoch longer: it resumes from the checkpoint in Blob",
             [*rehearse, "--resume", "--set", f"command={train} --epochs 3"], env)
        step(8, "the run's report: its plots and records on one HTML page",
             [py, "-m", "amlhpc.jobs", "report", RUN_NAME, "--local"], env)

        console.rule("[bold]9. stop Azurite")
    page = folders.REHEARSALS / RUN_NAME / REPORT_FILE
    console.print(f"[green]demo finished in {time.monotonic() - started:.0f} s[/]; job YAML in "
                  f"{job_yaml.relative_to(REPO_ROOT)}, node folders in .rehearsal/{RUN_NAME}/")
    console.print(f"run report: {page} (open it in a browser: file://{page})", soft_wrap=True)


def entry() -> int:
    """`python -m amlhpc.jobs.local.demo`: Ctrl-C or SIGTERM stops the running step, Azurite and
    everything below them (amlhpc/jobs/local/processes.py)."""
    try:
        with processes.supervised():
            main()
    except processes.Interrupted as stop:
        console.print(f"[yellow]demo interrupted ({stop}):[/] every process it started was stopped")
        return stop.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(entry())
