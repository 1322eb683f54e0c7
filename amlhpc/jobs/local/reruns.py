"""What a second `jobs run RECIPE --local` of the same name does: start fresh, or continue.

A rehearsal's name is its folder (`.rehearsal/<name>/`, or --workdir) and, through its
checkpoint key, a checkpoint prefix in Blob (`<recipe>/<key>` in the checkpoints
container). `run.json` in the folder records the key, so the folder and its checkpoints
stay one run.

- Without `--resume` a name that already holds a run starts a new one: the earlier run's
  folder is set aside as `<name>-<when it started>` (a rehearsal of its own in `jobs list
  --local`, with its records, logs and report; `--name <that> --resume` continues it), and
  the new run gets a checkpoint key no earlier run used, so it never resumes from another
  run's checkpoints - nor from checkpoints a pruned folder left in Blob.
- With `--resume` the run named continues from its own latest checkpoint. A run that had
  already finished trains nothing; `trained_steps` reads what the attempt did from the
  launcher's progress files, and the command says so instead of "succeeded".

Nothing is deleted: setting a run aside is a rename in the same folder.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RUN_FILE = "run.json"
"""The run's identity in its folder: name, recipe, checkpoint key and prefix, when it began."""
ATTEMPTS_FILE = "attempts.jsonl"


@dataclass(frozen=True)
class Earlier:
    """A run found in a rehearsal folder."""

    folder: Path
    key: str
    """Its checkpoint key (`<recipe>/<key>` in the checkpoints container)."""
    recipe: str
    attempts: int
    outcome: str
    """succeeded, failed (status N), or interrupted (no attempt ended)."""
    started: str
    """When its first attempt started (UTC, 20261126-011104), or the folder's time."""


def _attempt_lines(folder: Path) -> list[dict[str, Any]]:
    try:
        text = (folder / ATTEMPTS_FILE).read_text()
    except OSError:
        return []
    lines = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            lines.append(value)
    return lines


def _stamp(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y%m%d-%H%M%S")


def earlier(folder: Path) -> Earlier | None:
    """The run `folder` holds (its run.json, or an older folder's attempts), or None."""
    try:
        record = json.loads((folder / RUN_FILE).read_text())
    except (OSError, ValueError):
        record = None
    attempts = _attempt_lines(folder)
    if not isinstance(record, dict) and not attempts:
        return None
    record = record if isinstance(record, dict) else {}
    codes = [int(c) for c in (attempts[-1].get("exit_codes") or {}).values()] if attempts else []
    outcome = ("succeeded" if codes and all(c == 0 for c in codes) else
               f"failed (status {next(c for c in codes if c != 0)})" if codes else "interrupted")
    started = str(record.get("started") or "")
    if attempts and attempts[0].get("started_at"):
        started = str(attempts[0]["started_at"]).replace("-", "").replace(":", "").replace("T", "-").rstrip("Z")
    if not started:
        started = _stamp(folder.stat().st_mtime)
    return Earlier(folder, str(record.get("key") or folder.name), str(record.get("recipe") or ""), len(attempts),
                   outcome, started)


def set_aside(run: Earlier) -> Path:
    """Rename the run's folder to `<name>-<started>` beside it (a free name), keeping its key."""
    target = run.folder.with_name(f"{run.folder.name}-{run.started}")
    n = 2
    while target.exists():
        target = run.folder.with_name(f"{run.folder.name}-{run.started}-{n}")
        n += 1
    run.folder.rename(target)
    remember(target, name=target.name, recipe=run.recipe, key=run.key, started=run.started)
    return target


def new_key(name: str, taken: bool, now: float | None = None) -> str:
    """The checkpoint key of a fresh run: its name, unless checkpoints are already stored under it."""
    return f"{name}-{_stamp(now if now is not None else time.time())}" if taken else name


def remember(folder: Path, *, name: str, recipe: str, key: str, started: str | None = None,
             checkpoint_prefix: str | None = None) -> None:
    """Write the run's run.json (before its processes start, so an interrupted run has one)."""
    folder.mkdir(parents=True, exist_ok=True)
    import getpass

    document = {"name": name, "recipe": recipe, "key": key, "checkpoint_prefix": checkpoint_prefix or f"{recipe}/{key}",
                "started": started or _stamp(time.time()), "user": getpass.getuser()}
    tmp = folder / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(folder / RUN_FILE)


@dataclass(frozen=True)
class Trained:
    """What one attempt's training did, from rank 0's progress file (amlhpc.jobs.runtime.base.progress)."""

    resumed_from: int | None
    last_step: int | None
    completed: bool

    @property
    def steps(self) -> int | None:
        if self.last_step is None:
            return None
        return self.last_step - (self.resumed_from or 0)


def trained_steps(workdir: Path, run_id: str) -> Trained | None:
    """Rank 0's progress in the attempt `run_id` (None when the launcher left no progress file)."""
    for path in sorted(workdir.glob(f"node0/scratch/.amlhpc-launch/{run_id}-node*/progress/rank-0.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict):
            continue
        completed = doc.get("completed") if isinstance(doc.get("completed"), dict) else None
        last = completed.get("step") if completed else doc.get("step")
        resumed = doc.get("resumed_from")
        return Trained(resumed if isinstance(resumed, int) else None, last if isinstance(last, int) else None,
                       completed is not None)
    return None
