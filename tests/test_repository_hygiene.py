"""The repository as a whole: lint clean, and the product speaks only of itself.

Code, docs, recipes, job data and tests cite public sources (a document's title or URL);
they never point at files that are not in this repository. Both checks run in `make test`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Built from parts so this file does not match itself.
_OUTSIDE_REFERENCES = re.compile(
    "|".join([
        r"\bseeds?[ _/-]?0\d\d",          # the source documents the project started from
        "FIELD" + "_NOTES",
        r"\b(?:STYLE|DESIGN|PERFORMANCE)" + r"\.md\b",
        r"\.\./" + "shared",
    ]),
    re.IGNORECASE,
)


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    files = []
    for name in listed:
        path = ROOT / name
        if path.is_file() and not name.endswith((".lock", "package-lock.json")):
            files.append(path)
    return files


def test_product_cites_public_sources_not_outside_files():
    hits = []
    for path in tracked_text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if _OUTSIDE_REFERENCES.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not hits, "cite the public source (title or URL) instead:\n" + "\n".join(hits)


def test_the_pattern_catches_what_it_must():
    seed = "se" + "ed"
    samples = [f"as {seed} 003 says", f"see {seed}s/004_x.txt", "FIELD" + "_NOTES.md", "../" + "shared/x.md",
               "STYLE" + ".md 6", f"{seed.upper()}003_LAYOUT"]
    assert all(_OUTSIDE_REFERENCES.search(s) for s in samples)
    assert not _OUTSIDE_REFERENCES.search("NAG's CosmoFlow tutorial (2021); seeded RNG; seed=0")


def test_ruff_is_clean():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
