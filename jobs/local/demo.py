"""`make demo`: the main job, offline, on embedded defaults - every step a user would type.

1. start Azurite (the local Blob service), with a fresh account and key;
2. the offline plan of the dev stack;
3. the cosmoflow job rendered for dev as Azure ML YAML (what `submit` would send);
4. a small synthetic CosmoFlow dataset in the real file naming;
5. `jobs data upload`: gzip-encoded into the stack's datasets container (Azurite);
6. `jobs run cosmoflow --local` on 2 simulated nodes x 2 ranks: staging, health gate,
   pinning, DDP training over gloo, checkpoints to Blob - the staging report, the loss per
   step and the checkpoint location are printed;
7. the same run name again, one epoch longer: it resumes from the checkpoint;
8. stop Azurite.

Each step runs the real command line in a subprocess; the demo stops at the first failure
with that step's exit status. Finishes in a few minutes on 2 cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from jobs.local import azurite
from jobs.runtime import contract

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRATCH = REPO_ROOT / ".scratch" / "demo"
RUN_NAME = "cosmoflow-demo"
PREFIX = "cosmoflow/cosmoUniverse_2019_05_4parE_tf"  # the recipe's input path
TRAIN = ("python -m jobs.workloads.cosmoflow.train --input cosmoflow --batch-size 2 --conv-size 4 "
         "--n-conv-layers 3 --fc1 16 --fc2 8 --workers 0 --log-every 1 --epochs {epochs}")

console = Console(highlight=False)


def step(number: int, title: str, argv: list[str], env: dict[str, str]) -> None:
    console.rule(f"[bold]{number}. {title}")
    shown = " ".join(a if " " not in a else repr(a) for a in argv)
    console.print(f"[dim]$ {shown}[/]")
    started = time.monotonic()
    result = subprocess.run(argv, cwd=REPO_ROOT, env=env)
    if result.returncode != 0:
        console.print(f"[red]step {number} failed with exit status {result.returncode}[/]")
        raise SystemExit(result.returncode)
    console.print(f"[dim]({time.monotonic() - started:.1f} s)[/]")


def main() -> None:
    started = time.monotonic()
    py = sys.executable
    shutil.rmtree(SCRATCH, ignore_errors=True)
    shutil.rmtree(REPO_ROOT / ".rehearsal" / RUN_NAME, ignore_errors=True)
    SCRATCH.mkdir(parents=True)
    env = {**os.environ, "COLUMNS": os.environ.get("COLUMNS", "160")}

    console.rule("[bold]1. start Azurite (local Blob)")
    with azurite.start(Path(tempfile.mkdtemp(prefix="aml-hpc-demo-azurite-"))) as server:
        console.print(f"Azurite blob service at {server.blob_endpoint} (account {server.account}, generated key)")
        env[contract.BLOB_CONNECTION_STRING] = server.connection_string

        step(2, "offline plan of the dev stack", [py, "-m", "infra", "plan", "--stack", "dev"], env)

        job_yaml = SCRATCH / "cosmoflow-dev.yml"
        console.rule("[bold]3. the cosmoflow job for dev, as Azure ML YAML")
        argv = [py, "-m", "jobs", "submit", "cosmoflow", "--stack", "dev", "--offline", "--dry-run"]
        console.print(f"[dim]$ {' '.join(argv)} > {job_yaml.relative_to(REPO_ROOT)}[/]")
        rendered = subprocess.run(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
        if rendered.returncode != 0:
            raise SystemExit(rendered.returncode)
        job_yaml.write_text(rendered.stdout)
        console.print(rendered.stdout, markup=False)

        data = SCRATCH / "cosmoflow-data"
        step(4, "a small synthetic CosmoFlow dataset (real naming, compressible volumes)",
             [py, "-m", "jobs.workloads.cosmoflow.generate", str(data), "--universes", "1",
              "--validation-universes", "1", "--volume", "32", "--subvolumes", "16"], env)

        step(5, "upload it gzip-encoded to the dev stack's datasets container (Azurite)",
             [py, "-m", "jobs", "data", "upload", str(data), "--stack", "dev", "--offline", "--prefix", PREFIX,
              "--connection-string-env", contract.BLOB_CONNECTION_STRING], env)

        rehearse = [py, "-m", "jobs", "run", "cosmoflow", "--local", "--stack", "dev", "--nodes", "2",
                    "--procs-per-node", "2", "--name", RUN_NAME, "--quiet"]
        step(6, "rehearse cosmoflow: 2 simulated nodes x 2 ranks (staging, health gate, DDP, checkpoints)",
             [*rehearse, "--set", f"command={TRAIN.format(epochs=2)}"], env)
        step(7, "the same run again, one epoch longer: it resumes from the checkpoint in Blob",
             [*rehearse, "--set", f"command={TRAIN.format(epochs=3)}"], env)

        console.rule("[bold]8. stop Azurite")
    console.print(f"[green]demo finished in {time.monotonic() - started:.0f} s[/]; job YAML in "
                  f"{job_yaml.relative_to(REPO_ROOT)}, node folders in .rehearsal/{RUN_NAME}/")


if __name__ == "__main__":
    main()
