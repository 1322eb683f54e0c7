"""What the command lines do when the machine, not the input, is the problem - a folder it
cannot write, a full disk, a missing tool, the wrong Python or the wrong directory - and
how they print off a terminal: one line with the fix and no traceback (`--debug` shows it),
tables written out in full."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from amlhpc.core.errors import UserError, exit_on_bad_input, os_error_line

REPO = Path(__file__).resolve().parent.parent
DEV_OUTPUTS = REPO / "tests" / "fixtures" / "outputs" / "dev.json"


def jobs(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "AMLHPC_PROJECT")}
    return subprocess.run([sys.executable, "-m", "amlhpc.jobs", *args], cwd=cwd, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=300)


class TestOneLine:
    @pytest.mark.parametrize("exc, says", [
        (PermissionError(errno.EACCES, "Permission denied", ".scratch/code-snapshots"),
         "cannot write .scratch/code-snapshots: permission denied: fix: make it writable"),
        (OSError(errno.EROFS, "Read-only file system", "/mnt/ro/.scratch"),
         "cannot write /mnt/ro/.scratch: read-only file system: fix:"),
        (OSError(errno.ENOSPC, "No space left on device", ".rehearsal/x/node0"),
         "no space left on the device holding .rehearsal/x/node0: fix: free some space (`make clean`"),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "az"),
         "az: command not found: fix: install az, or add the folder holding it to PATH"),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "data/missing/file.bin"),
         "data/missing/file.bin: no such file or folder: fix: check the path"),
        (FileExistsError(errno.EEXIST, "File exists", ".scratch"),
         ".scratch: a file (or a broken link) is where a folder is needed: fix: move it out of the way"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
         "connection refused: fix: check the network"),
    ])
    def test_each_os_error_is_one_line_with_the_fix(self, exc, says, capsys):
        assert says in os_error_line(exc) and "\n" not in os_error_line(exc)
        with pytest.raises(SystemExit) as stop, exit_on_bad_input():
            raise exc
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and says in err

    def test_debug_shows_the_traceback_instead(self):
        with pytest.raises(PermissionError), exit_on_bad_input(debug=True):
            raise PermissionError(errno.EACCES, "Permission denied", "x")

    def test_a_closed_pipe_is_quiet(self, capsys):
        with pytest.raises(SystemExit) as stop, exit_on_bad_input():
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        assert stop.value.code == 1 and capsys.readouterr().err == ""


def _unwritable(folder: Path) -> None:
    """`folder` as a folder this process cannot write in: read-only for a user; for root
    (which ignores permission bits) a link into /sys, where nothing can be created."""
    if os.geteuid() != 0:
        folder.mkdir()
        folder.chmod(0o555)
        return
    probe = Path("/sys/fs/aml-hpc-probe")
    try:
        probe.mkdir()
    except OSError:
        folder.symlink_to(Path("/sys/fs"))  # exists; nothing can be made in it
        return
    probe.rmdir()
    pytest.skip("running as root with a writable /sys: no folder here refuses a write")


class TestWholeCommands:
    def test_a_read_only_scratch_on_a_dry_run(self, tmp_path):
        project = tmp_path / "project"
        project.mkdir()
        shutil.copy(REPO / "Pulumi.yaml", project)
        _unwritable(project / ".scratch")
        result = jobs("submit", "cosmoflow", "--stack", "dev", "--outputs", str(DEV_OUTPUTS), "--dry-run",
                      env={"AMLHPC_PROJECT": str(project)})
        assert result.returncode == 2, result.stderr[-2000:]
        assert "Traceback" not in result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("error: cannot write") and ".scratch" in last and "fix:" in last
        debug = jobs("submit", "cosmoflow", "--stack", "dev", "--outputs", str(DEV_OUTPUTS), "--dry-run", "--debug",
                     env={"AMLHPC_PROJECT": str(project)})
        assert "Traceback" in debug.stderr

    def test_the_wrong_python_says_which_and_how(self):
        result = subprocess.run([sys.executable, "-S", "-m", "amlhpc.jobs", "--version"], cwd=REPO, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.count("\n") == 1 and "does not have aml-hpc's dependencies" in result.stderr
        assert "make bootstrap" in result.stderr

    def test_outside_a_project_the_offline_plan_says_where_to_go(self, tmp_path):
        result = subprocess.run([sys.executable, "-m", "amlhpc.infra", "plan", "--stack", "dev"], cwd=REPO,
                                env={**os.environ, "AMLHPC_PROJECT": str(tmp_path)}, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2 and "no aml-hpc project here" in result.stderr and "--project DIR" in result.stderr

    def test_run_needs_no_local_flag(self):
        """`run` rehearses; without --local it goes on to what the recipe needs of this machine."""
        result = jobs("run", "cosmoflow-tf")
        assert result.returncode == 2 and "add --local" not in result.stderr and "nothing to run" not in result.stderr
        assert "needs Python modules tensorflow" in result.stderr

    def test_the_dry_run_yaml_names_no_path_of_this_machine(self, tmp_path):
        import yaml

        project = tmp_path / "team-platform"
        (project / "jobs-yaml").mkdir(parents=True)
        shutil.copy(REPO / "Pulumi.yaml", project)
        result = jobs("submit", "cosmoflow", "--stack", "dev", "--outputs", str(DEV_OUTPUTS), "--dry-run",
                      cwd=project / "jobs-yaml", env={"PYTHONPATH": str(REPO)})
        assert result.returncode == 0, result.stderr[-2000:]
        code = Path(yaml.safe_load(result.stdout)["code"])
        assert code.as_posix().startswith("../.scratch/code-snapshots/")
        assert (project / "jobs-yaml" / code / "amlhpc" / "jobs" / "runtime" / "launch" / "launcher.py").is_file()
        assert str(REPO) not in result.stdout and str(tmp_path) not in result.stdout

    def test_offline_on_an_azure_only_command_asks_for_no_login(self):
        result = jobs("status", "some-job", "--stack", "dev", "--offline")
        assert result.returncode == 2 and "needs Azure" in result.stderr and "az login" in result.stderr
        assert "sign in" in result.stderr and "planning" not in result.stderr  # refused before any plan


class TestTablesOffATerminal:
    def test_a_pipe_gets_every_value_in_full(self):
        """Piped (as in CI logs), no cell is cut: a table wraps its cells within 80 columns, every
        word of every value there, and `-o tsv` has each value whole on its line."""
        from amlhpc.jobs import recipes

        result = jobs("recipes")
        assert result.returncode == 0 and "…" not in result.stdout
        words = set(" ".join(line.replace("│", " ") for line in result.stdout.splitlines()).split())
        for name in recipes.available():
            assert set(recipes.load(name).description.split()) <= words, name
        whole = jobs("recipes", "-o", "tsv")
        for name in recipes.available():
            assert recipes.load(name).description in whole.stdout, name
        estimate = jobs("estimate", "cosmoflow", "--stack", "dev", "--outputs", str(DEV_OUTPUTS))
        assert estimate.returncode == 0 and "…" not in estimate.stdout

    def test_a_narrow_terminal_wraps_cells_instead_of_cutting_them(self):
        from io import StringIO

        from rich.console import Console

        from amlhpc.core.console import table

        grid = table("attempt", "status", "cause")
        grid.add_row("1", "Failed", "preempted (retried)")
        buffer = StringIO()
        Console(file=buffer, width=24, force_terminal=True, color_system=None).print(grid)
        text = buffer.getvalue()
        assert "…" not in text
        assert all(piece in text for piece in ("preem", "pted", "(retr", "ied)", "Fail", "ed"))

    def test_json_goes_to_stdout_alone(self):
        result = jobs("estimate", "cosmoflow", "--stack", "dev", "--outputs", str(DEV_OUTPUTS), "--json")
        document = json.loads(result.stdout)
        assert document["recipe"] == "cosmoflow" and document["usd"] == pytest.approx(652.73)


def test_user_errors_outside_a_guard_still_end_in_one_block(capsys):
    """The entry point's wrapper (amlhpc.core.cli_help.run) catches what a command let through."""
    import typer

    from amlhpc.core.cli_help import run
    from amlhpc.core.errors import Problem

    app = typer.Typer()

    @app.command()
    def boom() -> None:
        raise UserError([Problem("x.yaml", "key", "bad value", "the fix")], "invalid input")

    with pytest.raises(SystemExit) as stop:
        run(app, "test", [])
    assert stop.value.code == 2 and "x.yaml: key: bad value" in capsys.readouterr().err
