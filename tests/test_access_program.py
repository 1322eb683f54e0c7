"""The access program (amlhpc/infra/access): the CI identities, their GitHub credentials and roles, the
custom roles and per-environment state, under Pulumi's mock runtime - each checked against the
permission model and against what the environment stacks assign."""

from __future__ import annotations

import copy
import json

import pytest

from amlhpc.core.errors import UserError
from amlhpc.core.permissions import MODEL
from amlhpc.infra.access.config import parse
from amlhpc.infra.access.github import commands
from amlhpc.infra.access.program import build
from amlhpc.infra.plan import evaluate, record
from amlhpc.infra.plan.mocks import FAKE_SUBSCRIPTION
from amlhpc.infra.policy import run_rules
from amlhpc.infra.policy.model import StackView
from amlhpc.infra.policy.plan_check import views_from_plan

ROLE = "azure-native:authorization:RoleAssignment"
CONFIG = {"aml-hpc-access:repository": "my-org/aml-hpc", "aml-hpc-access:stateAccount": "amlhpcstate1",
          "azure-native:location": "swedencentral"}


@pytest.fixture(scope="module")
def access():
    resources, outputs, _ = record(lambda: build(parse(CONFIG, "test")), "access")
    return resources, outputs


def of_type(resources, type_token: str):
    return [r for r in resources if r.type == type_token]


def identity_principal(resources, name: str) -> str:
    from amlhpc.infra.plan.mocks import _stable_uuid

    assert any(r.inputs.get("resourceName") == name for r in resources), name
    return _stable_uuid("principal", name)


class TestGitHubCredentials:
    def test_one_credential_per_identity_for_its_github_environment_only(self, access):
        resources, _ = access
        creds = {r.inputs["resourceName"]: r.inputs for r in of_type(resources, "azure-native:managedidentity:FederatedIdentityCredential")}
        assert {name: c["subject"] for name, c in creds.items()} == {
            "id-amlhpc-dev-deploy": "repo:my-org/aml-hpc:environment:dev",
            "id-amlhpc-prod-deploy": "repo:my-org/aml-hpc:environment:prod",
            "id-amlhpc-dev-teardown": "repo:my-org/aml-hpc:environment:teardown-dev",
            "id-amlhpc-prod-teardown": "repo:my-org/aml-hpc:environment:teardown-prod",
        }
        # GitHub's issuer, and the audience azure/login requests (Azure/login README, OIDC).
        assert all(c["issuer"] == "https://token.actions.githubusercontent.com"
                   and c["audiences"] == ["api://AzureADTokenExchange"] for c in creds.values())

    def test_the_pull_request_checks_get_no_identity(self, access):
        resources, _ = access
        text = json.dumps([r.inputs for r in resources])
        assert "pull_request" not in text and ":ref:" not in text
        assert MODEL.rights_of("pr-checks") == []


class TestRoles:
    def test_every_assignment_is_a_right_of_the_model_at_its_environments_scope(self, access):
        resources, _ = access
        roles = of_type(resources, ROLE)
        expected = []
        for env, locked in (("dev", False), ("prod", True)):
            for principal in ("deploy", "teardown"):
                for right in MODEL.rights_of(principal, "access-setup"):
                    if right.when is None or (right.when == "dataset-lock" and locked):
                        expected.append(f"{principal}-{env}-{right.key}")
        assert sorted(r.name for r in roles) == sorted(expected)
        for r in roles:
            principal, env = r.name.split("-")[:2]
            right = MODEL.right(principal, r.name.split("-", 2)[2])
            assert r.inputs["principalId"] == identity_principal(resources, f"id-amlhpc-{env}-{principal}")
            assert r.inputs["roleDefinitionId"].endswith(right.role.guid_in(FAKE_SUBSCRIPTION))
            expected_scope = {"resource-group": f"/resourceGroups/rg-amlhpc-{env}",
                              "state-container": f"/containers/state-{env}",
                              "experiments-state-container": f"/containers/state-{env}-experiments"}[right.scope]
            assert r.inputs["scope"].endswith(expected_scope), r.name

    def test_teardown_holds_nothing_on_the_environments_state(self, access):
        """Its only container is its experiments': no condition to get wrong, nothing else there."""
        resources, _ = access
        held: dict[tuple[str, str], list[str]] = {}
        for r in of_type(resources, ROLE):
            principal, env = r.name.split("-")[:2]
            if "/containers/" in r.inputs["scope"]:
                held.setdefault((principal, env), []).append(r.inputs["scope"].rsplit("/", 1)[-1])
                assert r.inputs.get("condition") is None, r.name
        for env in ("dev", "prod"):
            assert held[("teardown", env)] == [f"state-{env}-experiments"]
            assert sorted(held[("deploy", env)]) == [f"state-{env}", f"state-{env}-experiments"]

    def test_the_policy_refuses_teardown_state_on_the_environments_container(self, access):
        """The policy pack tells the two containers apart: teardown's right moved back onto
        state-prod (or the deploy's environment right onto state-prod-experiments) is refused."""
        resources, _ = access
        plan = copy.deepcopy({"stack": "access", "resources": [r.to_json() for r in resources]})
        for name, old, new in (("teardown-prod-teardown-state", "/state-prod-experiments", "/state-prod"),
                               ("deploy-prod-deploy-state", "/state-prod", "/state-prod-experiments")):
            (entry,) = [e for e in plan["resources"] if e.get("name") == name]
            entry["inputs"]["scope"] = entry["inputs"]["scope"].replace(old, new)
        views, _ = views_from_plan(plan)
        found = sorted(v.message for v in run_rules(views, StackView("access", "environment"))
                       if v.rule == "role-in-permission-model")
        assert len(found) == 2
        assert "not the model's state-container" in found[0] and "deploy-prod-deploy-state" in found[0]
        assert "not the model's experiments-state-container" in found[1] and "teardown-prod-teardown-state" in found[1]

    def test_role_assignments_are_constrained_to_what_the_program_assigns(self, access):
        resources, _ = access
        (dev_admin,) = [r for r in of_type(resources, ROLE) if r.name == "deploy-dev-deploy-role-assignments"]
        condition = dev_admin.inputs["condition"]
        assert dev_admin.inputs["conditionVersion"] == "2.0"
        # one GuidEquals set per group of principal types, repeated for writes and deletes
        listed = {guid for part in condition.split("GuidEquals {")[1:] for guid in part.split("}")[0].split(", ")}
        program = {r.role.guid_in(FAKE_SUBSCRIPTION) for r in MODEL.rights if r.granted_by in ("program", "azure-ml")}
        assert listed == program
        owner, uaa = "8e3af657-a8ff-443c-a75c-2fe8c4bcb635", "18d7d88d-d35e-4fb5-a5c3-7773c20a72d9"
        assert owner not in condition and uaa not in condition
        # writes and deletes both constrained (Microsoft Learn, "Constrain roles" example)
        assert "@Request[Microsoft.Authorization/roleAssignments:RoleDefinitionId]" in condition
        assert "@Resource[Microsoft.Authorization/roleAssignments:RoleDefinitionId]" in condition

    def test_the_access_stack_passes_the_role_rules(self, access):
        resources, _ = access
        plan = {"stack": "access", "resources": [r.to_json() for r in resources]}
        views, _ = views_from_plan(plan)
        found = [v for v in run_rules(views, StackView("access", "environment"))
                 if v.rule in ("no-privileged-roles", "role-in-permission-model")]
        assert found == []


class TestCustomRoles:
    def test_definitions_are_the_models_and_assignable_in_the_environments_only(self, access):
        resources, _ = access
        definitions = {r.name.removeprefix("role-"): r.inputs for r in of_type(resources, "azure-native:authorization:RoleDefinition")}
        assert set(definitions) == {role.key for role in MODEL.custom_roles()} == {"controller", "teardown", "lock-writer", "submitter"}
        for key, inputs in definitions.items():
            role = MODEL.role(key)
            assert inputs["roleDefinitionId"] == role.guid_in(FAKE_SUBSCRIPTION)
            assert inputs["permissions"] == [{"actions": list(role.actions), "dataActions": list(role.data_actions),
                                              "notActions": list(role.not_actions)}]
            assert sorted(s.rsplit("/", 1)[-1] for s in inputs["assignableScopes"]) == ["rg-amlhpc-dev", "rg-amlhpc-prod"]
            assert FAKE_SUBSCRIPTION in inputs["roleName"]  # one per subscription: names are unique per tenant

    def test_the_environment_stack_assigns_the_role_this_program_defines(self, access):
        resources, _ = access
        (controller,) = [r for r in of_type(resources, "azure-native:authorization:RoleDefinition")
                         if r.name == "role-controller"]
        dev = evaluate("dev")
        (jobs,) = [r for r in dev.of_type(ROLE) if r.name == "controller-access-jobs"]
        assert jobs.inputs["roleDefinitionId"].rsplit("/", 1)[-1] == controller.inputs["roleDefinitionId"]

    def test_teardown_can_delete_clusters_and_budgets_and_nothing_else(self):
        teardown = MODEL.role("teardown")
        deletes = [a for a in teardown.actions if a.endswith("/delete")]
        assert deletes == ["Microsoft.MachineLearningServices/workspaces/computes/delete",
                           "Microsoft.Consumption/budgets/delete"]

    def test_the_controller_role_holds_no_secret_or_destructive_action(self):
        role = MODEL.role("controller")
        for action in ("Microsoft.MachineLearningServices/workspaces/datastores/listsecrets/action",
                       "Microsoft.MachineLearningServices/workspaces/connections/listsecrets/action",
                       "Microsoft.MachineLearningServices/workspaces/listKeys/action",
                       "Microsoft.MachineLearningServices/workspaces/jobs/delete",
                       "Microsoft.MachineLearningServices/workspaces/computes/write",
                       "Microsoft.MachineLearningServices/workspaces/onlineEndpoints/write"):
            assert not role.allows(action), action
        assert all(role.why[a] for a in role.actions), "every action says which call needs it"


class TestState:
    def test_two_protected_containers_per_environment_on_a_keyless_versioned_account(self, access):
        resources, outputs = access
        containers = {r.inputs["containerName"]: r for r in of_type(resources, "azure-native:storage:BlobContainer")}
        assert sorted(containers) == ["state-dev", "state-dev-experiments", "state-prod", "state-prod-experiments"]
        # the environment's container keeps its resource name: an existing access stack does not replace it
        assert all(c.name == name and c.protect for name, c in containers.items())
        (account,) = of_type(resources, "azure-native:storage:StorageAccount")
        assert account.inputs["allowSharedKeyAccess"] is False and account.inputs["allowBlobPublicAccess"] is False
        (service,) = of_type(resources, "azure-native:storage:BlobServiceProperties")
        assert service.inputs["isVersioningEnabled"] is True

    def test_the_workflows_get_the_account_and_derive_each_container(self, access):
        _, outputs = access
        for name in ("dev", "prod", "teardown-dev", "teardown-prod"):
            assert outputs["github"][name]["AMLHPC_STATE_ACCOUNT"] == "amlhpcstate1"
            assert "PULUMI_BACKEND_URL" not in outputs["github"][name]
        # each stack's container from the account: tests/test_lifecycle_script.py::TestOneEnvironmentPerJob

    def test_an_environment_named_like_experiments_is_refused(self):
        from dataclasses import replace

        cfg = parse(CONFIG, "test")
        sneaky = replace(cfg, environments=(*cfg.environments, cfg.environments[0].model_copy(update={"stack": "dev-experiments"})))
        with pytest.raises(UserError) as info:
            build(sneaky)
        assert "environment 'dev-experiments' ends in '-experiments'" in info.value.render()

    def test_environment_groups_exist_before_their_first_deployment(self, access):
        resources, _ = access
        groups = {r.inputs["resourceGroupName"]: r for r in of_type(resources, "azure-native:resources:ResourceGroup")}
        assert set(groups) == {"rg-amlhpc-access", "rg-amlhpc-dev", "rg-amlhpc-prod"}
        # the environment stack owns the tags and retains the group: adopted on its first up
        assert groups["rg-amlhpc-prod"].ignore_changes == ["tags"] and groups["rg-amlhpc-prod"].retain_on_delete


class TestConfig:
    @pytest.mark.parametrize("key, value, fragment", [
        ("aml-hpc-access:repository", "not a repo", "is not a GitHub owner/name"),
        ("aml-hpc-access:stateAccount", "Bad_Name", "aml-hpc-access:stateAccount: 'Bad_Name'"),
        ("aml-hpc-access:environments", ["dev", "exp-x"], "'exp-x' is an experiment stack"),
        ("aml-hpc-access:stateAcount", "x", "unknown key"),
    ])
    def test_bad_values_are_named(self, key, value, fragment):
        with pytest.raises(UserError) as info:
            parse({**CONFIG, key: value}, "amlhpc/infra/access/Pulumi.access.yaml")
        assert fragment in info.value.render()


class TestGitHubEnvironments:
    def test_every_environment_is_limited_to_main_and_prod_needs_reviewers(self, access):
        _, outputs = access
        lines = commands(outputs["github"], "my-org/aml-hpc", ["team:ml-platform"])
        for name in ("dev", "prod", "teardown-dev", "teardown-prod"):
            put = next(line for line in lines if line.startswith(f"gh api -X PUT repos/my-org/aml-hpc/environments/{name} "))
            assert "deployment_branch_policy[custom_branch_policies]=true" in put
            assert ("reviewers[][id]=$(gh api orgs/my-org/teams/ml-platform --jq .id)" in put) == (name == "prod")
            assert (f"gh api -X POST repos/my-org/aml-hpc/environments/{name}/deployment-branch-policies "
                    "-f name=main -f type=branch") in lines
        variables = [line for line in lines if line.startswith("gh variable set")]
        assert len(variables) == 16 and all(" --env " in line for line in variables)  # never repository-wide

    def test_passphrases_go_to_their_environments_only(self, access, tmp_path):
        """An environment's own passphrase goes to its deploy job only; teardown-<env> gets its
        experiments' passphrase, as its only secret."""
        _, outputs = access
        for env in ("dev", "prod"):
            (tmp_path / f"{env}.txt").write_text("x")
            (tmp_path / f"{env}-experiments.txt").write_text("y")
        lines = commands(outputs["github"], "my-org/aml-hpc", ["team:ml-platform"], tmp_path)
        secrets = sorted(line for line in lines if line.startswith("gh secret set"))
        base = "gh secret set {} --repo my-org/aml-hpc --env {} < " + str(tmp_path) + "/{}"
        assert secrets == sorted([
            base.format("PULUMI_CONFIG_PASSPHRASE", "dev", "dev.txt"),
            base.format("PULUMI_EXPERIMENTS_PASSPHRASE", "dev", "dev-experiments.txt"),
            base.format("PULUMI_CONFIG_PASSPHRASE", "prod", "prod.txt"),
            base.format("PULUMI_EXPERIMENTS_PASSPHRASE", "prod", "prod-experiments.txt"),
            base.format("PULUMI_CONFIG_PASSPHRASE", "teardown-dev", "dev-experiments.txt"),
            base.format("PULUMI_CONFIG_PASSPHRASE", "teardown-prod", "prod-experiments.txt")])
        assert not any(line.endswith(("/prod.txt", "/dev.txt")) for line in secrets if "--env teardown-" in line)

    def test_a_missing_passphrase_file_is_named_before_anything_runs(self, access, tmp_path):
        _, outputs = access
        for env in ("dev", "prod"):
            (tmp_path / f"{env}.txt").write_text("x")
        with pytest.raises(UserError) as info:
            commands(outputs["github"], "my-org/aml-hpc", ["team:ml-platform"], tmp_path)
        text = info.value.render()
        assert f"{tmp_path}/dev-experiments.txt" in text and "openssl rand -base64 32" in text

    def test_outputs_of_an_older_access_program_are_refused(self, access):
        _, outputs = access
        old = {name: {k: v for k, v in entry.items() if k not in ("AMLHPC_STATE_ACCOUNT", "secrets")}
               for name, entry in outputs["github"].items()}
        with pytest.raises(UserError) as info:
            commands(old, "my-org/aml-hpc", ["team:ml-platform"])
        assert "has no AMLHPC_STATE_ACCOUNT, secrets" in info.value.render()
        assert "scripts/access-setup.sh up" in info.value.render()

    def test_prod_without_reviewers_is_refused(self, access):
        _, outputs = access
        with pytest.raises(UserError, match="'prod' needs required reviewers"):
            commands(outputs["github"], "my-org/aml-hpc", [])


class TestScript:
    """scripts/access-setup.sh: its refusals name the fix; it drives `pulumi -C amlhpc/infra/access`."""

    def run(self, *args: str, path: str = "/usr/bin:/bin", **env: str):
        import subprocess

        from amlhpc.infra.config import REPO_ROOT

        return subprocess.run(["bash", str(REPO_ROOT / "scripts" / "access-setup.sh"), *args], cwd=REPO_ROOT, text=True,
                              capture_output=True, env={"PATH": path, "HOME": "/tmp", **env}, timeout=60)

    def test_unknown_action_and_missing_cli_are_refused(self):
        unknown = self.run("apply")
        assert unknown.returncode == 2 and "unknown action 'apply'" in unknown.stderr
        missing = self.run("up")
        assert missing.returncode == 127 and "the Pulumi CLI is not installed" in missing.stderr

    def test_up_runs_the_access_program_on_its_own_stack(self, tmp_path):
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "pulumi").write_text('#!/usr/bin/env bash\nprintf "%s|%s\\n" "$*" "$PULUMI_BACKEND_URL" >> "$LOG"\n')
        (fake / "pulumi").chmod(0o755)
        log = tmp_path / "log"
        result = self.run("up", "--", "--yes", path=f"{fake}:/usr/bin:/bin", LOG=str(log), PULUMI_CONFIG_PASSPHRASE="x",
                          ACCESS_BACKEND_URL=f"file://{tmp_path}/state")
        assert result.returncode == 0, result.stderr
        assert log.read_text().splitlines() == [
            f"-C amlhpc/infra/access stack select --create --secrets-provider passphrase access|file://{tmp_path}/state",
            f"-C amlhpc/infra/access up --stack access --yes|file://{tmp_path}/state"]


class TestBranchProtection:
    """Without protection on main, anyone who can push to it runs main's workflows in every
    environment (prod's reviewers approve a deployment, not the code it runs)."""

    def test_main_is_protected_first_admins_included(self, access):
        import json

        _, outputs = access
        lines = commands(outputs["github"], "my-org/aml-hpc", ["team:ml-platform"])
        assert lines[0].startswith("gh api -X PUT repos/my-org/aml-hpc/branches/main/protection --input - <<< ")
        body = json.loads(lines[0].split("<<< ", 1)[1].strip("'"))
        assert body["enforce_admins"] is True and body["allow_force_pushes"] is False and body["allow_deletions"] is False
        reviews = body["required_pull_request_reviews"]
        assert reviews["required_approving_review_count"] >= 1 and reviews["require_last_push_approval"] is True

    def test_reviewed_environments_prevent_self_review(self, access):
        _, outputs = access
        lines = commands(outputs["github"], "my-org/aml-hpc", ["team:ml-platform"])
        for name in ("dev", "prod", "teardown-dev", "teardown-prod"):
            put = next(line for line in lines if line.startswith(f"gh api -X PUT repos/my-org/aml-hpc/environments/{name} "))
            assert ("prevent_self_review=true" in put) == (name == "prod")

    @pytest.mark.parametrize("answer, holds", [
        ({"enforce_admins": {"enabled": True}, "allow_force_pushes": {"enabled": False},
          "allow_deletions": {"enabled": False}, "required_pull_request_reviews": {"required_approving_review_count": 1}}, True),
        ({"enforce_admins": {"enabled": False}, "allow_force_pushes": {"enabled": False},
          "allow_deletions": {"enabled": False}, "required_pull_request_reviews": {"required_approving_review_count": 1}}, False),
        ({"enforce_admins": {"enabled": True}, "allow_force_pushes": {"enabled": True},
          "allow_deletions": {"enabled": False}, "required_pull_request_reviews": {"required_approving_review_count": 1}}, False),
        ({"enforce_admins": {"enabled": True}, "allow_force_pushes": {"enabled": False},
          "allow_deletions": {"enabled": False}}, False),
    ])
    def test_the_check_fails_unless_main_is_protected(self, access, tmp_path, answer, holds):
        """The check lines run against a fake gh that answers what GitHub would, through jq."""
        import json
        import shutil
        import subprocess

        if shutil.which("jq") is None:
            pytest.skip("needs jq (the gh CLI's --jq filter is jq's language)")
        _, outputs = access
        lines = commands(outputs["github"], "my-org/aml-hpc", ["team:ml-platform"])
        (check,) = [line for line in lines if "branches/main/protection --jq" in line]
        env_answer = {"protection_rules": [{"type": "required_reviewers", "prevent_self_review": True}]}
        fake = tmp_path / "gh"
        fake.write_text("#!/usr/bin/env bash\n"
                        f"case $2 in *branches*) a={json.dumps(json.dumps(answer))} ;; *) a={json.dumps(json.dumps(env_answer))} ;; esac\n"
                        'printf "%s" "$a" | jq -c "$4"\n')
        fake.chmod(0o755)
        result = subprocess.run(["bash", "-c", check], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, capture_output=True,
                                text=True, timeout=30)
        assert (result.returncode == 0) == holds, result.stderr
        if not holds:
            assert "main is not protected as required" in result.stderr
