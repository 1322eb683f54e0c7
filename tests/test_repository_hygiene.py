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


# How the project was made is not what it is: no numbers of our own tracker's entries (an
# upstream one names its repository first: "Azure/MachineLearningNotebooks" and the number),
# no words about who worked on it or in which round. Built from parts so this file does not
# match itself.
_MAKING_OF = re.compile(
    "|".join([
        r"\bthe " + "lead" + r"(?:'s)?\b",
        r"\bthis " + "round" + r"\b",
        r"\bround " + r"[1-9]\b",
        r"device-" + "tool",
        r"\b" + "helper" + r"s? (?:had|added|wrote|session)\b",
    ]),
    re.IGNORECASE,
)
_ISSUE_NUMBER = re.compile(r"\b" + "issue" + r" \d+\b", re.IGNORECASE)
_UPSTREAM = re.compile(r"[\w.-]+/[\w.-]+\s+$")


def making_of(line: str, before: str = "") -> bool:
    """`line` (after the line `before` it, where a repository name may end) speaks of the making."""
    if _MAKING_OF.search(line):
        return True
    context = f"{before.strip()} {line}"
    offset = len(context) - len(line)
    return any(not _UPSTREAM.search(context[:offset + m.start()]) for m in _ISSUE_NUMBER.finditer(line))


def test_the_product_speaks_of_what_it_is_not_how_it_was_made():
    hits = []
    for path in tracked_text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        lines = text.splitlines()
        for number, line in enumerate(lines, 1):
            if making_of(line, lines[number - 2] if number > 1 else ""):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not hits, "say what it is, or cite the upstream tracker by repository:\n" + "\n".join(hits)


def test_the_making_of_pattern_catches_what_it_must():
    word = "iss" + "ue"
    bad = [f"found ({word} 11, section 3)", f"# {word} 2: H200", "the " + "lead's plan", "lent this " + "round",
           "# device-" + "tool carry folders", "measured in round " + "1"]
    good = [f"Azure/MachineLearningNotebooks {word} 1242", f"pulumi-azure-native {word} #1123",
            f"microsoft/MLOpsPython {word} 346", "helpers for the plan tests", "the leader's result"]
    assert all(making_of(s) for s in bad), [s for s in bad if not making_of(s)]
    assert not any(making_of(s) for s in good), [s for s in good if making_of(s)]
    assert not making_of(f"{word} 1242 and more", "as reported in Azure/MachineLearningNotebooks")


def test_ruff_is_clean():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
