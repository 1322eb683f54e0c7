"""The test files that cover what changed on this branch: for `make check`, the edit loop.

Changed means: files that differ from the merge base with main (committed or not) and new
untracked files. A changed test file is selected; a changed module under amlhpc/ selects
every test file that names it (`amlhpc.jobs.runtime.launch.watchdog`, or its package and
module name imported with `from ... import`). The layer and hygiene tests always run. Prints
the paths, one per line.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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


if __name__ == "__main__":
    sys.stdout.write("\n".join(selected(changed_files())) + "\n")
