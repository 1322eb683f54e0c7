"""Every help screen of every CLI (jobs, infra, images) shows flags as flags: `--json`, not
`--json <bool>`; options that take a value still show its type."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner


def _apps():
    from amlhpc.app import build
    from amlhpc.images.cli import app as images_app
    from amlhpc.infra.cli import app as infra_app
    from amlhpc.jobs.cli.main import app as jobs_app

    return {"jobs": jobs_app, "infra": infra_app, "images": images_app, "aml-hpc": build()}


def _commands(group, path: tuple[str, ...] = ()):
    """(path, command) for the group and every command below it (typer vendors its own click)."""
    yield path, group
    if hasattr(group, "commands"):
        for name, sub in sorted(group.commands.items()):
            yield from _commands(sub, (*path, name))


@pytest.mark.parametrize("cli", ["jobs", "infra", "images", "aml-hpc"])
def test_no_flag_shows_a_value_type(cli):
    app = _apps()[cli]
    runner = CliRunner()
    checked = 0
    for path, command in _commands(typer.main.get_command(app)):
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, f"{cli} {' '.join(path)} --help:\n{result.output}"
        for param in command.params:
            if getattr(param, "param_type_name", "") == "option" and param.is_flag and not param.hidden:
                assert param.opts[0] in result.output
        checked += 1
    assert checked > 1


def test_value_options_keep_their_type_and_set_reads_key_value():
    from amlhpc.jobs.cli.main import app

    result = CliRunner().invoke(app, ["submit", "--help"], env={"COLUMNS": "200"})
    assert "--hours" in result.output and "<float>" in result.output
    assert "KEY=VALUE" in result.output and "<list[str]>" not in result.output
    run_help = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert "INPUT=DIR" in run_help and "<list[str]>" not in run_help
    assert "--fault" in run_help and "SPEC" in run_help and "hang@step=6,node=1" in run_help
    for gone in ("--preempt-at-step", "--hang-at-step", "--kill-host-at-step", "--slow-node", "--kill-controller-at",
                 "--no-replacement"):  # one way to ask for a fault: --fault SPEC
        assert gone not in run_help, gone


@pytest.mark.parametrize("cli", ["jobs", "infra", "images", "aml-hpc"])
def test_every_command_takes_h_and_every_app_version(cli):
    """`-h` is `--help` on every command; `--version` prints the one version (amlhpc/core/version.py)."""
    from amlhpc.core.version import __version__

    app = _apps()[cli]
    runner = CliRunner()
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.stdout.strip() == f"aml-hpc {__version__}"
    for path, _ in _commands(typer.main.get_command(app)):
        short = runner.invoke(app, [*path, "-h"], env={"COLUMNS": "200"})
        assert short.exit_code == 0 and "Usage:" in short.output, (path, short.output)


@pytest.mark.parametrize("cli", ["jobs", "infra", "images"])
def test_completion_and_exit_statuses_in_the_root_help(cli):
    from amlhpc.core.cli_help import EXIT_STATUSES

    help_text = CliRunner().invoke(_apps()[cli], ["--help"], env={"COLUMNS": "250"}).output
    assert "--install-completion" in help_text and "--show-completion" in help_text
    assert "Exit status:" in help_text
    for code, _, _ in EXIT_STATUSES:
        assert f"{code}: " in help_text


def test_typer_itself_is_left_as_it_is():
    """Flags are shown bare through typer's public `cls=`, not by replacing typer's methods."""
    import typer.core

    _apps()
    assert typer.core.TyperOption.display_type_rich.__module__ == "typer.core"
    assert typer.core.TyperOption.display_type_rich.__qualname__ == "TyperOption.display_type_rich"


DATA_COMMANDS = {
    "jobs": {("recipes",), ("estimate",), ("quota",), ("status",), ("list",), ("show",), ("scale-report",),
             ("deepspeed-plan",), ("data", "upload"), ("beeond", "status")},
    "infra": {("plan",), ("expired",), ("config-keys",)},
    "images": {("list",)},
}
"""The commands that print data (tables, documents): each takes --json."""


@pytest.mark.parametrize("cli", ["jobs", "infra", "images"])
def test_json_is_a_flag_on_every_command_that_prints_data(cli):
    """`--json` prints JSON; nowhere is it an option that takes a path (images smoke writes its
    results with --results-file)."""
    commands = dict(_commands(typer.main.get_command(_apps()[cli])))
    for path in DATA_COMMANDS[cli]:
        params = {p.opts[0]: p for p in commands[path].params if getattr(p, "param_type_name", "") == "option"}
        assert "--json" in params, f"{cli} {' '.join(path)} has no --json"
    for path, command in commands.items():
        for param in command.params:
            if "--json" in getattr(param, "opts", ()):
                assert param.is_flag, f"{cli} {' '.join(path)}: --json takes a value"


def test_doctor_prints_json_too():
    import inspect

    from amlhpc.doctor.cli import doctor

    assert "as_json" in inspect.signature(doctor).parameters
