"""What a team adopting aml-hpc reads first: the README says what the project is and how to
start, under which license; one version with its changelog; the config table is the config
model's; the exit statuses are the CLI's; the `aml-hpc` commands in the docs exist."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
import typer

from amlhpc.core.cli_help import EXIT_STATUSES
from amlhpc.core.version import __version__
from amlhpc.infra import config, config_doc

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


class TestReadme:
    def test_it_opens_with_what_the_project_is_then_the_two_commands(self):
        lines = README.splitlines()
        assert lines[0] == "# aml-hpc"
        summary = next(line for line in lines[1:] if line.strip())
        assert "Azure Machine Learning" in summary
        head = "\n".join(lines[:15])
        assert re.search(r"^make demo\b", head, re.M) and re.search(r"^make test\b", head, re.M)
        assert head.index("# aml-hpc") < head.index("make demo")

    def test_it_states_the_license(self):
        assert "Apache License 2.0" in README and "[LICENSE](LICENSE)" in README
        text = (REPO / "LICENSE").read_text()
        assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]

    def test_the_config_table_is_the_config_models(self):
        """Regenerate with `python -m amlhpc.infra config-keys --update README.md`."""
        assert config_doc.current_in(README) == config_doc.section(), \
            "README.md's config table is stale: python -m amlhpc.infra config-keys --update README.md"

    def test_every_key_is_in_the_table_and_documented(self):
        keys = {f"{config.NAMESPACE}{f.alias or n}" for n, f in config._RawConfig.model_fields.items()}
        table = config_doc.current_in(README) or ""
        assert all(f"`{k}`" in table for k in keys), [k for k in keys if f"`{k}`" not in table]
        assert "`aml-hpc:submitters`" in table
        undocumented = [k.key for k in config_doc.keys() if k.meaning == config_doc.UNDOCUMENTED]
        assert not undocumented, f"document these in amlhpc/infra/config/models.py (a docstring under the field) or MEANING: {undocumented}"


class TestVersion:
    def test_one_source(self):
        pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
        assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
        assert pyproject["tool"]["hatch"]["version"]["path"] == "amlhpc/core/version.py"
        assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+|rc\d+)?", __version__)

    def test_the_changelog_keeps_a_changelog(self):
        text = (REPO / "CHANGELOG.md").read_text()
        assert text.startswith("# Changelog") and "https://keepachangelog.com/en/1.1.0/" in text
        sections = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
        assert sections[0] == ("Unreleased", ""), "the first section is [Unreleased]"
        released = [(v, d) for v, d in sections[1:]]
        assert released and all(d for _, d in released), "every release has a date"
        assert __version__ in [v for v, _ in released], f"amlhpc/core/version.py's {__version__} has no changelog section"
        kinds = set(re.findall(r"^### (\w+)$", text, re.M))
        assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def exit_status_table_markdown() -> str:
    """EXIT_STATUSES as the Markdown table docs/cli.md holds."""
    lines = ["| status | meaning | commands |", "|---|---|---|"]
    lines += [f"| {code} | {meaning} | {where if where == 'all' else f'`{where}`'} |"
              for code, meaning, where in EXIT_STATUSES]
    return "\n".join(lines) + "\n"


def test_the_exit_status_table_is_the_clis():
    text = (REPO / "docs" / "cli.md").read_text()
    assert exit_status_table_markdown() in text


_AML_HPC = re.compile(r"^(?:\S*/)?(aml-hpc(?:-jobs|-infra|-images)?)(\s|$)")


def _aml_hpc_lines() -> list[tuple[str, str]]:
    from tests.test_docs_commands import blocks, commands, segments

    found = []
    for doc in DOCS:
        for block in blocks(doc):
            if block.kind is None:
                continue
            for line in commands(block):
                for segment in segments(line):
                    if _AML_HPC.match(segment):
                        found.append((block.where, segment))
    return found


@pytest.mark.parametrize("where, segment", _aml_hpc_lines())
def test_aml_hpc_lines_in_the_docs_name_real_commands(where, segment):
    from amlhpc.app import build, one_app, take_project

    argv = shlex.split(segment)
    program, args = argv[0].rsplit("/", 1)[-1], take_project(argv[1:])[0]
    app = build() if program == "aml-hpc" else one_app(program)
    command = typer.main.get_command(app)
    eager = {"--version", "--install-completion", "--show-completion"} & set(args)
    if eager:  # parsing them would act (print, or install completion in this machine's shell)
        declared = {opt for p in command.params for opt in getattr(p, "opts", ())}
        assert eager <= declared, f"{where}: `{segment}`: {eager - declared} not an option of {program}"
        return
    ctx = command.make_context(program, list(args), resilient_parsing=False)
    while hasattr(command, "commands"):
        pending = [*(getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", [])), *ctx.args]
        assert pending, f"{where}: `{segment}` names no command"
        name, *rest = pending
        sub = command.get_command(ctx, name)
        assert sub is not None, f"{where}: `{segment}`: no command {name!r}"
        ctx = sub.make_context(name, rest, parent=ctx, resilient_parsing=False)
        command = sub
