"""The README and docs/*.md tell the truth: every command block is classified, and each is
checked the way its class allows.

Every fenced block names its language. Shell blocks (bash, sh, shell, console) carry a
marker on the line just above the fence:

    <!-- commands: offline -->   runs as written on a fresh clone after `make bootstrap`, with
                                 no Azure, login, Pulumi CLI or Docker: run here, block by
                                 block, in a scratch copy of the repository; must exit 0
    <!-- commands: azure -->     needs something outside this machine (a subscription, az
                                 login, the Pulumi CLI, Docker, the internet): not run, but
                                 every `python -m amlhpc.jobs|infra|images` line must name real
                                 commands and options, and every `make` target must exist
    <!-- commands: long -->      offline but minutes long (the suite, the demo, benchmarks):
                                 its `make` targets must exist

Other languages (text, json, jsonc, yaml, toml) are data and are not run. A block with no
language, or a shell block with no marker, fails here with its file and line, so nothing is
skipped silently. Blocks of one file run in order in the same copy (a later block may use
what an earlier one made).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.plan_helpers import commit_all

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
DATA = {"text", "json", "jsonc", "yaml", "toml", "xml", "python", "dockerfile", "ini"}
CLASSES = {"offline", "azure", "long"}
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*commands:\s*(\S+)\s*-->\s*$")
_OUR_CLI = re.compile(r"^(?:\S*/)?python3?\s+-m\s+amlhpc\.(jobs|infra|images)(\s|$)")


@dataclass
class Block:
    doc: Path
    line: int
    language: str
    kind: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    found, lines, i = [], doc.read_text().splitlines(), 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, indent, language = i, fence.group(1), fence.group(2).lower()
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(above)
        body, i = [], i + 1
        while i < len(lines) and not re.match(rf"^{indent}```\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        found.append(Block(doc, start + 1, language, marker.group(1) if marker else None, "\n".join(body)))
        i += 1
    return found


def commands(block: Block) -> list[str]:
    """The block's command lines: continuations joined, comments and blanks dropped."""
    joined, current = [], ""
    for raw in block.text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip() and not current.strip().startswith("#"):
            joined.append(current.strip())
        current = ""
    return joined


def segments(command: str) -> list[str]:
    """Simple commands of a line: split at && || ; | (outside quotes)."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return [command]
    out, current = [], []
    for token in tokens:
        if token in (";", "&&", "||", "|", "&"):
            out.append(current)
            current = []
        elif token.startswith("#"):
            break
        else:
            current.append(token)
    out.append(current)
    return [shlex.join(s) for s in out if s]


ALL_BLOCKS = [b for doc in DOCS for b in blocks(doc)]


def test_docs_have_command_blocks():
    assert len([b for b in ALL_BLOCKS if b.kind == "offline"]) >= 4


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.where)
def test_every_block_is_classified(block):
    assert block.language, f"{block.where}: name the block's language (bash for commands, text for anything else)"
    if block.language in SHELL:
        assert block.kind in CLASSES, (f"{block.where}: a shell block needs a marker line above it: "
                                       "<!-- commands: offline|azure|long --> (see tests/test_docs_commands.py)")
    else:
        assert block.language in DATA, f"{block.where}: unknown block language {block.language!r}"
        assert block.kind is None, f"{block.where}: only shell blocks carry a commands marker"


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), re.M))


def _check_parses(argv: list[str], where: str) -> None:
    """Resolve `python -m X sub ... --opts` with the real typer app without running it."""
    import typer

    module = argv[2].removeprefix("amlhpc.")
    app = {"jobs": lambda: __import__("amlhpc.jobs.cli.main", fromlist=["app"]).app,
           "infra": lambda: __import__("amlhpc.infra.cli", fromlist=["app"]).app,
           "images": lambda: __import__("amlhpc.images.cli", fromlist=["app"]).app}[module]()
    command = typer.main.get_command(app)
    args = argv[3:]
    ctx = command.make_context(f"python -m {module}", list(args), resilient_parsing=False)
    while hasattr(command, "commands"):
        pending = [*(getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", [])), *ctx.args]
        assert pending, f"{where}: `{shlex.join(argv)}` names no command"
        name, *rest = pending
        sub = command.get_command(ctx, name)
        assert sub is not None, f"{where}: `{shlex.join(argv)}`: no command {name!r}"
        ctx = sub.make_context(name, rest, parent=ctx, resilient_parsing=False)
        command = sub


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.kind in ("azure", "long")], ids=lambda b: b.where)
def test_commands_that_are_not_run_still_exist(block):
    targets = _make_targets()
    for line in commands(block):
        for segment in segments(line):
            argv = shlex.split(segment)
            if argv and argv[0] == "make":
                named = [a for a in argv[1:] if "=" not in a and not a.startswith("-")]
                assert named and all(t in targets for t in named), f"{block.where}: `{segment}`: no such make target"
            elif _OUR_CLI.match(segment):
                try:
                    _check_parses(argv, block.where)
                except Exception as exc:  # click's usage errors name the bad option
                    raise AssertionError(f"{block.where}: `{segment}` does not parse: {exc}") from None


def _scratch_copy(tmp_path: Path) -> Path:
    """The repository's files (tracked and new, not ignored) with the installed environments linked in."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    copy = tmp_path / "repo"
    for rel in filter(None, listed):
        source = REPO / rel
        if source.is_file():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / rel)  # keeps times: the bootstrap stamps stay newer than uv.lock
    # A fresh clone is a git checkout with origin/main: commands that compare revisions
    # (`infra plan --diff-ref`) need one.
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=copy, check=True)
    commit_all(copy, "a fresh clone")
    subprocess.run(["git", "update-ref", "refs/remotes/origin/main", "HEAD"], cwd=copy, check=True)
    for env in (".venv", "node_modules", ".bootstrap"):
        if (REPO / env).exists():
            (copy / env).symlink_to(REPO / env)
    return copy


OFFLINE_DOCS = sorted({b.doc for b in ALL_BLOCKS if b.kind == "offline"})


@pytest.mark.slow
@pytest.mark.timeout(900)  # README's blocks rehearse several jobs end to end: minutes on 2 busy cores
@pytest.mark.parametrize("doc", OFFLINE_DOCS, ids=lambda d: d.name)
def test_offline_blocks_run_as_written(doc, tmp_path):
    copy = _scratch_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AMLHPC_BLOB_CONNECTION_STRING")}
    env["COLUMNS"] = "120"
    for block in [b for b in blocks(doc) if b.kind == "offline"]:
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=copy, env=env,
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, (f"{block.where} exited {result.returncode}:\n{block.text}\n--- output ---\n"
                                        f"{(result.stdout + result.stderr)[-4000:]}")
        assert "Traceback" not in result.stderr, f"{block.where}:\n{result.stderr[-3000:]}"
