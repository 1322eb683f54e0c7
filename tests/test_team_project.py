"""A team's own project: `aml-hpc init`, its recipes and training code, the dry run `az ml job
create -f` loads from wherever it is written, deploying from the installed tool, and hints that
name the commands the user has (amlhpc/scaffold, amlhpc/jobs/recipes, amlhpc/jobs/plan/build.py,
amlhpc/jobs/cli/main.py, amlhpc/infra/deploy.py, amlhpc/core/invocation.py).

The same, end to end from the wheel installed in a clean environment: tests/test_install.py.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from amlhpc import scaffold
from amlhpc.core import invocation, project
from amlhpc.core.errors import UserError
from amlhpc.infra import deploy
from amlhpc.jobs import recipes
from amlhpc.jobs.local import requirements
from amlhpc.jobs.plan import build
from tests.jobs_helpers import stack_outputs

# Loaded here, not under the `team` fixture: modules that read the project's location when they
# load (amlhpc.jobs.plan.outputs' REPO_ROOT) must keep this repository's for the other tests.
DEV = stack_outputs("dev")

REPO = Path(__file__).resolve().parent.parent
DEV_OUTPUTS = REPO / "tests" / "fixtures" / "outputs" / "dev.json"


def _python(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "AMLHPC_PROJECT")}
    return subprocess.run([sys.executable, *args], cwd=cwd, env={**base, "PYTHONPATH": str(REPO), **(env or {})},
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def team(tmp_path, monkeypatch) -> Path:
    """A project made by `aml-hpc init`, the current project of this process."""
    folder = tmp_path / "team-platform"
    scaffold.create(folder)
    monkeypatch.setenv(project.ENV_VARIABLE, str(folder))
    return folder


class TestInit:
    def test_a_project_whose_program_is_the_installed_one(self, tmp_path):
        folder = tmp_path / "new"
        written = scaffold.create(folder)
        assert sorted(p.relative_to(folder).as_posix() for p in written) == sorted(scaffold.FILES)
        pulumi = yaml.safe_load((folder / "Pulumi.yaml").read_text())
        assert pulumi["name"] == "aml-hpc"  # experiments find their environment as organization/aml-hpc/<env>
        assert "main" not in pulumi and pulumi["runtime"] == {"name": "python", "options": {"toolchain": "pip"}}
        program = ast.parse((folder / "__main__.py").read_text())
        imported = [n for n in ast.walk(program) if isinstance(n, ast.ImportFrom)]
        assert [(n.module, [a.name for a in n.names]) for n in imported] == [("amlhpc.infra.engine", ["run"])]
        assert project.is_project(folder) and "aml-hpc:owner" in (folder / "Pulumi.dev.yaml").read_text()
        assert ".scratch/" in (folder / ".gitignore").read_text().splitlines()
        assert "# new" in (folder / "README.md").read_text()

    def test_its_dev_stack_is_the_repositorys(self, tmp_path):
        """The template's dev environment declares what this repository's Pulumi.dev.yaml does."""
        scaffold.create(tmp_path / "new")
        ours = yaml.safe_load((tmp_path / "new" / "Pulumi.dev.yaml").read_text())
        assert ours == yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())

    def test_nothing_is_overwritten_and_nothing_is_written_then(self, tmp_path):
        folder = tmp_path / "existing"
        (folder / "src").mkdir(parents=True)
        (folder / "src" / "train.py").write_text("mine")
        (folder / "Pulumi.yaml").write_text("name: theirs\n")
        with pytest.raises(UserError) as info:
            scaffold.create(folder)
        assert "already holds Pulumi.yaml, src/train.py" in info.value.render()
        assert sorted(p.name for p in folder.rglob("*")) == ["Pulumi.yaml", "src", "train.py"]
        assert (folder / "src" / "train.py").read_text() == "mine"

    def test_in_an_existing_repository_the_gitignore_grows_and_the_readme_stays(self, tmp_path):
        folder = tmp_path / "repo"
        folder.mkdir()
        (folder / ".gitignore").write_text("venv/\n.scratch/")
        (folder / "README.md").write_text("# ours\n")
        scaffold.create(folder)
        lines = (folder / ".gitignore").read_text().splitlines()
        assert lines[:2] == ["venv/", ".scratch/"] and lines.count(".scratch/") == 1 and ".rehearsal/" in lines
        assert (folder / "README.md").read_text() == "# ours\n"

    def test_a_failure_half_way_takes_back_what_it_wrote(self, tmp_path, monkeypatch):
        folder = tmp_path / "half"
        monkeypatch.setattr(scaffold, "FILES", {**scaffold.FILES, "src/extra.py": "no-such-template"})
        with pytest.raises(FileNotFoundError):
            scaffold.create(folder)
        assert not folder.exists()

    def test_the_command_says_what_to_run_next(self, tmp_path):
        made = _python("-m", "amlhpc", "init", "team", cwd=tmp_path)
        assert made.returncode == 0, made.stderr
        assert "cd team" in made.stdout and "python -m amlhpc.jobs run train --local" in made.stdout
        again = _python("-m", "amlhpc", "init", "team", cwd=tmp_path)
        assert again.returncode == 2 and "Traceback" not in again.stderr and "already holds" in again.stderr


class TestRecipes:
    def test_a_project_recipe_is_found_by_name_and_shadows_the_built_in_one(self, team):
        copy = yaml.safe_load((recipes.RECIPES_DIR / "cosmoflow.yaml").read_text())
        copy["description"] = "our cosmoflow"
        (team / "recipes" / "cosmoflow.yaml").write_text(yaml.safe_dump(copy))
        assert recipes.resolve("cosmoflow") == team / "recipes" / "cosmoflow.yaml"
        assert recipes.load("cosmoflow").description == "our cosmoflow"
        assert "train" in recipes.available() and set(recipes.builtin()) <= set(recipes.available())
        assert recipes.from_project() == ["cosmoflow", "train"]

    def test_an_unknown_name_lists_the_projects_and_the_built_in_ones(self, team):
        with pytest.raises(UserError) as info:
            recipes.resolve("trian")
        text = info.value.render()
        assert "did you mean train?" in text and "cosmoflow" in text and "recipes/" in text

    def test_the_recipes_command_says_where_each_comes_from(self, team):
        shutil.copy(recipes.RECIPES_DIR / "node-health.yaml", team / "recipes" / "node-health.yaml")
        listed = _python("-m", "amlhpc.jobs", "recipes", "--json", cwd=team)
        assert listed.returncode == 0, listed.stderr
        source = {r["recipe"]: r["source"] for r in yaml.safe_load(listed.stdout)}
        assert source["train"] == "project" and source["node-health"] == "project, shadows the built-in"
        assert source["cosmoflow"] == "built in"


class TestCode:
    def _recipe(self, team: Path, code: list[str], name: str = "train") -> recipes.Recipe:
        document = yaml.safe_load((team / "recipes" / "train.yaml").read_text())
        document["code"] = code
        path = team / "recipes" / f"{name}.yaml"
        path.write_text(yaml.safe_dump(document))
        return recipes.load(str(path))

    def test_folders_beside_the_recipe_in_the_project_absolute_and_aml_hpcs(self, team, tmp_path):
        (team / "recipes" / "helpers").mkdir()
        (team / "recipes" / "helpers" / "aug.py").write_text("# beside the recipe\n")
        elsewhere = tmp_path / "shared-lib"
        (elsewhere / "teamlib").mkdir(parents=True)
        (elsewhere / "teamlib" / "__init__.py").write_text("")
        recipe = self._recipe(team, ["src", "helpers", str(elsewhere), "amlhpc/jobs/workloads"])
        plan = build.plan_job(recipe, DEV)
        assert plan.code_dirs == ("amlhpc/jobs/runtime", str(team / "src"), str(team / "recipes" / "helpers"),
                                  str(elsewhere), "amlhpc/jobs/workloads")
        snap = build.snapshot(plan.code_dirs, dest_root=tmp_path / "snap")
        assert (snap / "train.py").read_text() == (team / "src" / "train.py").read_text()  # src's contents at the top
        assert (snap / "aug.py").is_file() and (snap / "teamlib" / "__init__.py").is_file()
        assert (snap / "amlhpc" / "jobs" / "runtime" / "launch" / "launcher.py").is_file()
        assert (snap / "amlhpc" / "__init__.py").is_file() and (snap / "amlhpc" / "jobs" / "workloads" / "common.py").is_file()
        assert (snap / "nccl-topo" / "ndv4-topo.xml").is_file()

    def test_the_runtime_travels_even_when_the_recipe_lists_only_the_teams_code(self, team, tmp_path):
        recipe = recipes.load("train")
        assert recipe.code == ["src"]
        plan = build.plan_job(recipe, DEV)
        assert plan.code_dirs == ("amlhpc/jobs/runtime", str(team / "src"))
        assert plan.command.startswith("python -m amlhpc.jobs.runtime.launch -- python train.py")

    def test_a_folder_that_is_not_there_is_named_with_the_recipe_file(self, team, monkeypatch):
        monkeypatch.chdir(team / "recipes")
        recipe = self._recipe(team, ["srcc", "/no/such/folder"])
        with pytest.raises(UserError) as info:
            build.plan_job(recipe, DEV)
        text = info.value.render()
        assert f".{os.sep}train.yaml: code[0]: 'srcc' is not a folder" in text and "jobs/recipes/" not in text
        assert "looked in ./, ../ and aml-hpc's package" in text
        assert "code[1]: '/no/such/folder' is not a folder (it is not a folder)" in text

    @pytest.mark.parametrize("name", ["amlhpc", "outputs"])
    def test_code_that_would_land_on_the_runtime_or_the_jobs_own_folders_is_refused(self, team, name):
        (team / "src" / name).mkdir()
        with pytest.raises(UserError) as info:
            build.plan_job(recipes.load("train"), DEV)
        assert f"both are {name!r} at its top" in info.value.render()

    def test_the_rehearsal_requirements_name_the_recipe_file(self, team, monkeypatch):
        monkeypatch.chdir(team)
        with pytest.raises(UserError) as info:
            requirements.check(recipes.load("train", local=True), env={"AMLHPC_BLOB_CONNECTION_STRING": "BlobEndpoint=x"},
                               machine=requirements.Machine(module_available=lambda name: False))
        assert info.value.problems[0].reference == os.path.join("recipes", "train.yaml")


class TestDryRunFile:
    def test_the_yaml_written_anywhere_loads_with_its_code(self, team):
        from azure.ai.ml import load_job

        (team / "jobs" / "deep").mkdir(parents=True)
        for where, out in ((team, ".scratch/job.yml"), (team / "jobs", "deep/job.yml"), (team, str(team.parent / "j.yml"))):
            written = _python("-m", "amlhpc.jobs", "submit", "train", "--stack", "dev", "--outputs", str(DEV_OUTPUTS),
                              "--dry-run", "--out", out, cwd=where)
            assert written.returncode == 0, written.stderr[-2000:]
            assert written.stdout == "" and "az ml job create -f" in written.stderr
            path = (where / out).resolve()
            job = load_job(path)
            code = (Path(job.base_path) / job.code).resolve()
            assert (code / "train.py").is_file() and (code / "amlhpc" / "jobs" / "runtime" / "launch").is_dir()
            assert str(team) not in path.read_text() or path.parent != team / ".scratch"
            assert not list(path.parent.glob(".*partial"))

    def test_out_needs_dry_run(self, team):
        result = _python("-m", "amlhpc.jobs", "submit", "train", "--stack", "dev", "--outputs", str(DEV_OUTPUTS),
                         "--out", "job.yml", cwd=team)
        assert result.returncode == 2 and "--out" in result.stderr and "add --dry-run" in result.stderr
        assert not (team / "job.yml").exists()


class TestDeploy:
    def test_a_pulumi_yaml_copied_from_a_clone_is_named_with_the_fix(self, team):
        shutil.copy(REPO / "Pulumi.yaml", team / "Pulumi.yaml")
        with pytest.raises(UserError) as info:
            deploy.check_program(team)
        paths = [p.path for p in info.value.problems]
        assert paths == ["main", "runtime.options.virtualenv"]
        assert "aml-hpc init" in info.value.render()

    def test_the_projects_own_program_and_the_repositorys_pass(self, team):
        deploy.check_program(team)
        deploy.check_program(REPO)

    def test_preview_runs_the_rules_with_this_interpreter_until_pulumi_is_missing(self, team):
        path = f"{Path(shutil.which('bash') or '/bin/bash').parent}:/usr/bin:/bin"
        result = _python("-m", "amlhpc.infra", "preview", "dev", cwd=team / "src", env={"PATH": path})
        assert result.returncode == 2, result.stderr
        assert "the Pulumi CLI is not installed" in result.stderr and "https://get.pulumi.com" in result.stderr
        assert "Traceback" not in result.stderr

    def test_the_script_is_told_the_project_the_interpreter_and_the_pack(self, team, monkeypatch):
        seen = {}

        def fake_run(argv, cwd, env, check):
            seen.update(argv=argv, cwd=cwd, env=env)
            return subprocess.CompletedProcess(argv, 0)

        monkeypatch.setattr(deploy.subprocess, "run", fake_run)
        monkeypatch.setattr(invocation, "from_clone", lambda: False)
        assert deploy.run("down", "dev", ["--diff"], confirm="dev") == 0
        assert seen["argv"][1:] == [str(deploy.INSTALLED_SCRIPT), "down", "dev", "--", "--diff"]
        env = seen["env"]
        assert (env["AMLHPC_PROJECT"], env["AMLHPC_PYTHON"], env["CONFIRM"], env["AMLHPC_TOOL"]) == \
            (str(team), sys.executable, "dev", "aml-hpc infra")
        assert (Path(env["AMLHPC_POLICY_PACK"]) / "PulumiPolicy.yaml").is_file() and seen["cwd"] == team

    @pytest.mark.parametrize("args, message", [
        (("up", "Dev!"), "is not a stack name"),
        (("up", "dev", "--confirm", "dev"), "No such option: --confirm"),
    ])
    def test_bad_input_stops_before_the_script(self, team, args, message):
        result = _python("-m", "amlhpc.infra", *args, cwd=team)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr

    def test_new_experiment_prints_the_installed_commands(self, team):
        result = _python("-c", "from amlhpc.core import invocation; invocation.from_clone = lambda: False; "
                         "import sys; sys.argv = ['aml-hpc-infra', 'new-experiment', 'sweep', '--env', 'dev']; "
                         "from amlhpc.app import infra_main; infra_main()", cwd=team)
        assert result.returncode == 0, result.stderr
        assert "aml-hpc infra preview exp-sweep" in result.stdout and "aml-hpc infra up exp-sweep" in result.stdout
        assert "make " not in result.stdout and (team / "Pulumi.exp-sweep.yaml").is_file()


class TestHints:
    """Every command a hint of the CLI names is one the user has: spelled by
    amlhpc/core/invocation.py, never a clone's make target, .venv path or `python -m` part in
    a literal (the code that runs inside jobs, runtime/ and workloads/, prints no CLI hint)."""

    TARGETS = "|".join(sorted(set(re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), re.M)), key=len,
                              reverse=True))
    CLONE_ONLY = re.compile(rf"\bmake ({TARGETS})\b|\.venv/|python3? -m (amlhpc\.(jobs|infra|images)|amlhpc)(\s|`|$)")
    ALLOWED_FILES = {"amlhpc/core/invocation.py", "amlhpc/core/interpreter.py"}
    ALLOWED = {"python -m amlhpc.jobs", "python -m amlhpc.infra", "python -m amlhpc.images"}
    """The prog names of `python -m amlhpc.X` itself (only shown to who ran it that way)."""

    def _literals(self, path: Path):
        tree = ast.parse(path.read_text())
        skipped = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                skipped.add(id(node.value))  # docstrings
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "either" and node.args:
                skipped.update(id(n) for n in ast.walk(node.args[0]))  # the clone's side of a hint
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
                yield node.lineno, node.value

    def test_no_hint_names_a_clone_only_command(self):
        found = []
        for path in sorted((REPO / "amlhpc").rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in self.ALLOWED_FILES or rel.startswith(("amlhpc/jobs/runtime/", "amlhpc/jobs/workloads/",
                                                             "amlhpc/scaffold/template/")):
                continue
            for line, text in self._literals(path):
                if text.strip() in self.ALLOWED or text.lstrip().startswith("<!--") or "; regenerate: " in text:
                    continue  # generated-file markers and lock headers are data, not hints
                if self.CLONE_ONLY.search(text):
                    found.append(f"{rel}:{line}: {text[:100]!r}")
        assert not found, "hints naming a clone's commands (use amlhpc/core/invocation.py):\n" + "\n".join(found)

    def test_the_scan_catches_what_it_looks_for(self, tmp_path):
        for bad in ("fix: make bootstrap", "run .venv/bin/python -m amlhpc.core.x", "python -m amlhpc.jobs list"):
            assert self.CLONE_ONLY.search(bad), bad
        assert not self.CLONE_ONLY.search("python -m amlhpc.jobs.runtime.launch --")

    def test_the_two_spellings(self, monkeypatch):
        assert invocation.from_clone()  # this suite runs from a clone
        clone = (invocation.command("jobs", "list --local"), invocation.deploy("down", "dev", confirm=True),
                 invocation.new_experiment("x", "dev", "7"), invocation.clean())
        assert clone == ("python -m amlhpc.jobs list --local", "make down STACK=dev CONFIRM=dev",
                         "make new-experiment NAME=x ENV=dev DAYS=7", "make clean")
        monkeypatch.setattr(invocation, "from_clone", lambda: False)
        installed = (invocation.command("jobs", "list --local"), invocation.deploy("down", "dev", confirm=True),
                     invocation.new_experiment("x", "dev", "7"), invocation.clean(), invocation.command("doctor"))
        assert installed == ("aml-hpc jobs list --local", "aml-hpc infra down dev --confirm dev",
                             "aml-hpc infra new-experiment x --env dev --days 7", "rm -rf .rehearsal/ .scratch/ .azurite/",
                             "aml-hpc doctor")
        assert invocation.module("amlhpc.core.availability").startswith(sys.executable)
        assert "download.pytorch.org/whl/cpu" in invocation.torch_cpu()
        assert invocation.spoken("try python -m amlhpc.jobs run x --local") == "try aml-hpc jobs run x --local"

    def test_an_install_is_told_how_to_run_the_wrong_python_fix(self, monkeypatch):
        from amlhpc.core import interpreter

        assert "make bootstrap" in interpreter.fix("jobs")
        monkeypatch.setattr(invocation, "from_clone", lambda: False)
        fix = interpreter.fix("jobs")
        assert "aml-hpc jobs" in fix and "make" not in fix and ".venv" not in fix
