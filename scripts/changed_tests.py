"""The test files that cover what changed on this branch: for `make check`, the edit loop.

Changed means: files that differ from the merge base with main (committed or not) and new
untracked files. A changed test file is selected; a changed module under amlhpc/ selects
every test file that names it (`amlhpc.jobs.runtime.launch.watchdog`, or its package and
module name imported with `from ... import`). The layer and hygiene tests always run. Prints
the paths, one per line.

With `--time-box SECONDS --keep-file PATH` (what `make check` runs): collects the selected
files' tests, writes to PATH the ids that fit the box (tests/time_box.py: the changed test
files and the layer tests whole, then the cheapest of the rest, by the times earlier runs recorded) and says on
stderr what it left out.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests import time_box  # noqa: E402 - the repository's root is on the path from here on

ALWAYS = ("tests/test_layers.py", "tests/test_import_direction.py")


def _git(*args: str) -> list[str]:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if line] if done.returncode == 0 else []


def changed_files() -> set[str]:
    base = next(iter(_git("merge-base", "HEAD", "main")), "HEAD")
    return set(_git("diff", "--name-only", base)) | set(_git("ls-files", "--others", "--exclude-standard"))


def _mentions(module: str) -> re.Pattern[str]:
    package, _, name = module.rpartition(".")
    return re.compile(rf"\b{re.escape(module)}\b|from {re.escape(package)} import [^\n]*\b{re.escape(name)}\b")


def selected(changed: set[str]) -> list[str]:
    tests = sorted(REPO.glob("tests/**/test_*.py"))
    chosen = {path for path in changed if path.startswith("tests/") and Path(path).name.startswith("test_")
              and (REPO / path).is_file()}
    modules = [path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
               for path in changed if path.startswith("amlhpc/") and path.endswith(".py")]
    patterns = [_mentions(module) for module in modules]
    for test in tests:
        text = test.read_text(errors="replace")
        if any(pattern.search(text) for pattern in patterns):
            chosen.add(str(test.relative_to(REPO)))
    return sorted(chosen | set(ALWAYS))


def collected(files: list[str], marks: str) -> list[str] | None:
    """The test ids pytest collects from `files` (deselecting by `marks`); None when collecting fails."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", marks, *files], cwd=REPO, capture_output=True, text=True)
    if done.returncode not in (0, 5):  # 5: nothing collected
        return None
    return [line.strip() for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def box(files: list[str], changed: set[str], seconds: float, workers: int, keep_file: Path, marks: str) -> None:
    ids = collected(files, marks)
    if ids is None:  # a test file that does not import: the run shows its error, on every selected file
        keep_file.unlink(missing_ok=True)
        sys.stderr.write("make check: collecting the selected tests failed; no time box, the run shows why\n")
        return
    edited = [f for f in files if f in changed or f in ALWAYS]
    boxed = time_box.choose(ids, time_box.read_record(REPO), edited, seconds * workers)
    keep_file.parent.mkdir(parents=True, exist_ok=True)
    keep_file.write_text("\n".join(boxed.kept) + "\n")
    line = (f"make check: {len(boxed.kept)} of {len(ids)} selected tests, about {boxed.kept_s / workers:.0f}s in "
            f"{workers} workers")
    if boxed.left:
        per_file = Counter(time_box.file_of(i) for i in boxed.left)
        named = ", ".join(f"{f} ({n})" for f, n in per_file.most_common(4))
        line += (f"; left out {len(boxed.left)} (about {boxed.left_s / workers:.0f}s more) from {len(per_file)} file(s): "
                 f"{named}{', ...' if len(per_file) > 4 else ''}. `make check-all` runs them, `make test` everything")
    sys.stderr.write(line + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-box", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep-file", type=Path, default=REPO / ".pytest_cache" / "check-keep.txt")
    parser.add_argument("-m", dest="marks", default="not alone", help="pytest -m expression the run uses")
    args = parser.parse_args(argv)
    changed = changed_files()
    files = selected(changed)
    if args.time_box is not None:
        box(files, changed, args.time_box, max(1, args.workers), args.keep_file, args.marks)
    sys.stdout.write("\n".join(files) + "\n")


if __name__ == "__main__":
    main()
