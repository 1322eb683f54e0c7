"""`make check`'s time box: which of the tests that name a changed module run in the edit loop.

Every pytest run (`make test`, `make check`) records each test's setup and run time in
pytest's cache (`.pytest_cache`, RECORD_KEY). `make check` selects the test files that name a
changed module (scripts/changed_tests.py); when they would take longer than the box, it runs
the changed test files whole (the developer is editing them) and the layer tests, then the cheapest of the rest
that fit, and names what it left out: `make test` runs everything, `make check-all` every
selected test. A test with no record is costed at UNKNOWN_S.

Costs are per test, with a file's largest setup (a module-scoped fixture: a server, a
rehearsal world) charged once for the file, whichever of its tests goes first.

`make test` hands the parallel workers the files longest first (`longest_first`): a long file
started last leaves one worker running alone at the end. The order comes from the local record
where there is one, else from FILE_SECONDS, the files' times committed with the suite (a fresh
clone has no record); `python -m tests.time_box --write` refreshes it from the local record.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

RECORD_KEY = "amlhpc/durations"
"""pytest cache key of the recorded times: nodeid -> [setup s, run and teardown s]."""
UNKNOWN_S = 2.0
"""A test never run here: about the suite's mean (3,800 tests in ~60 min of CPU)."""
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
"""Each test file's seconds in a whole run (`file_seconds`), committed: the order of a fresh clone's run."""


def record_path(root: Path) -> Path:
    """Where pytest's cache keeps RECORD_KEY (its file layout: `.pytest_cache/v/<key>`)."""
    return root / ".pytest_cache" / "v" / RECORD_KEY


def read_record(root: Path) -> dict[str, list[float]]:
    try:
        data = json.loads(record_path(root).read_text())
    except (OSError, ValueError):
        return {}
    return {k: [float(x) for x in v] for k, v in data.items()
            if isinstance(v, list) and len(v) == 2} if isinstance(data, dict) else {}


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@dataclass
class Boxed:
    """What runs in the box and what was left out, with their estimated seconds of test time."""

    kept: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    kept_s: float = 0.0
    left_s: float = 0.0


def choose(nodeids: Iterable[str], record: Mapping[str, list[float]], keep_files: Iterable[str],
           box_s: float) -> Boxed:
    """Tests of `keep_files` always, then the cheapest others while the estimate stays within
    `box_s` seconds of test time (the box times the workers)."""
    ids = list(dict.fromkeys(nodeids))
    keep = set(keep_files)
    setup = {i: record[i][0] if i in record else 0.0 for i in ids}
    run = {i: record[i][1] if i in record else UNKNOWN_S for i in ids}
    shared: dict[str, float] = {}
    for i in ids:
        shared[file_of(i)] = max(shared.get(file_of(i), 0.0), setup[i])

    def own(i: str) -> float:  # the test's cost beyond its file's shared setup
        return run[i] + (setup[i] if setup[i] < shared[file_of(i)] else 0.0)

    boxed, opened = Boxed(), set()

    def cost(i: str) -> float:  # with the file's shared setup when none of its tests is kept yet
        return own(i) + (shared[file_of(i)] if file_of(i) not in opened else 0.0)

    def take(i: str, seconds: float) -> None:
        boxed.kept.append(i)
        boxed.kept_s += seconds
        opened.add(file_of(i))

    for i in ids:
        if file_of(i) in keep:
            take(i, cost(i))
    for i in sorted((i for i in ids if file_of(i) not in keep), key=lambda i: (own(i), i)):
        extra = cost(i)
        if boxed.kept_s + extra <= box_s:
            take(i, extra)
        else:
            boxed.left.append(i)
            boxed.left_s += extra
    order = {i: n for n, i in enumerate(ids)}
    boxed.kept.sort(key=order.__getitem__)
    return boxed


def merged(old: Mapping[str, list[float]], new: Mapping[str, list[float]]) -> dict[str, list[float]]:
    """The record after a run: this run's times replace the old ones of the tests it ran."""
    return {**old, **new}


def file_seconds(record: Mapping[str, list[float]]) -> dict[str, float]:
    """Each file's time: its largest setup (charged once, as `choose` does) and every test's run."""
    setup: dict[str, float] = {}
    run: dict[str, float] = {}
    for nodeid, (set_up, ran) in record.items():
        name = file_of(nodeid)
        setup[name] = max(setup.get(name, 0.0), set_up)
        run[name] = run.get(name, 0.0) + ran
    return {name: round(setup[name] + run[name], 1) for name in sorted(run)}


def weights(root: Path) -> dict[str, float]:
    """The files' times from the local record, else the committed FILE_SECONDS."""
    record = read_record(root)
    if record:
        return file_seconds(record)
    try:
        data = json.loads(FILE_SECONDS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def longest_first(nodeids: Iterable[str], seconds: Mapping[str, float]) -> list[str]:
    """The test ids with their files in descending time (a file never seen: UNKNOWN_S per test),
    each file's tests in their own order."""
    ids = list(nodeids)
    counts: dict[str, int] = {}
    for i in ids:
        counts[file_of(i)] = counts.get(file_of(i), 0) + 1
    position = {i: n for n, i in enumerate(ids)}

    def weight(name: str) -> float:
        return seconds.get(name, UNKNOWN_S * counts[name])
    return sorted(ids, key=lambda i: (-weight(file_of(i)), position[i]))


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.time_box --write   (tests/file_seconds.json from .pytest_cache's record)")
    found = read_record(Path.cwd())
    if not found:
        sys.exit(f"no record at {record_path(Path.cwd())}: run the suite first (make test)")
    FILE_SECONDS.write_text(json.dumps(file_seconds(found), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FILE_SECONDS} ({len(file_seconds(found))} files)")
