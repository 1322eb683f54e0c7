"""`aml-hpc doctor`: each check against Azure's own client code over a fake transport (ARM
GETs through azure-core's pipeline, quota through azure-ai-ml's MLClient, as tests/test_quota.py
and tests/test_submit.py do), the Pulumi CLI through a fake runner.

REST shapes: tests/fixtures/arm-rest/README.md and tests/fixtures/aml-rest/README.md.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
from azure.core.credentials import AccessToken

from amlhpc.core.errors import Problem, UserError
from amlhpc.doctor import arm as arm_mod
from amlhpc.doctor import checks
from tests.aml_fakes import FakeCredential, ServiceTransport, rest_json
from tests.jobs_helpers import stack_outputs

ARM_REST = Path(__file__).parent / "fixtures" / "arm-rest"
SUBSCRIPTION = "5f1a2b3c-0000-4000-8000-00000000abcd"
USER = "9a8b7c6d-1111-4222-8333-444455556666"
GROUP = "1c2d3e4f-aaaa-4bbb-8ccc-ddddeeeeffff"
RG = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-amlhpc-dev"
QUOTA_OK = dict(dedicated_used="0", dedicated_limit="400", a100_used="0", a100_limit="192", h100_used="0",
                h100_limit="384", lowpri_used="0", lowpri_limit="400")


def arm_json(name: str, **replace: str):
    text = (ARM_REST / name).read_text()
    for key, value in {"subscription": SUBSCRIPTION, "user": USER, "group": GROUP,
                       "resource_group": "rg-amlhpc-dev", **replace}.items():
        text = text.replace("{" + key + "}", value)
    return json.loads(text)


def jwt(**claims: str) -> str:
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJub25lIn0.{body}.sig"


class TokenCredential:
    def __init__(self, token: str):
        self.token = token

    def get_token(self, *scopes, **kwargs):
        return AccessToken(self.token, 4102444800)


def azure(*, state="Enabled", mls="Registered", consumption="Registered", group_role=checks.CONTRIBUTOR,
          user_role=checks.USER_ACCESS_ADMINISTRATOR, user_scope=f"/subscriptions/{SUBSCRIPTION}", quota=None,
          roles_status=200) -> ServiceTransport:
    """One fake ARM + Azure ML service."""
    roles = arm_json("role-assignments.json", group_role=group_role, user_role=user_role, user_scope=user_scope)
    return ServiceTransport({
        f"/subscriptions/{SUBSCRIPTION}": (200, arm_json("subscription.json", state=state)),
        "/providers": (200, arm_json("providers.json", state_machinelearningservices=mls, state_consumption=consumption)),
        "/roleAssignments": (roles_status, roles if roles_status == 200 else
                             {"error": {"code": "AuthorizationFailed", "message": "no read access"}}),
        "/usages": (200, rest_json("usages.json", **{**QUOTA_OK, **(quota or {})})),
        "/vmSizes": (200, rest_json("vmsizes.json")),
    })


def runner(version="v3.272.0", whoami_rc=0):
    def run(argv):
        if argv[:2] == ["pulumi", "version"]:
            return subprocess.CompletedProcess(argv, 0, version + "\n", "")
        if argv[:2] == ["pulumi", "whoami"]:
            out = "User: me\nOrganizations: \nBackend URL: file:///work/.pulumi-state\n"
            return subprocess.CompletedProcess(argv, whoami_rc, out if whoami_rc == 0 else "",
                                               "error: not logged in" if whoami_rc else "")
        raise AssertionError(f"unexpected command {argv}")
    return run


def target(submitters=(USER,)) -> checks.Target:
    return checks.Target(stack="dev", outputs=stack_outputs("dev"),
                         providers=["Microsoft.Consumption", "Microsoft.MachineLearningServices", "Microsoft.Storage"],
                         submitters=list(submitters), environment_file="Pulumi.dev.yaml")


def seams(transport: ServiceTransport, *, token=None, pulumi=True, environ=None, sign_in_error=None) -> checks.Seams:
    from azure.ai.ml import MLClient

    def credential():
        if sign_in_error:
            raise sign_in_error
        return TokenCredential(token or jwt(oid=USER, upn="ada@example.com", tid="t-1"))

    return checks.Seams(
        credential=credential,
        arm=lambda cred: arm_mod.Arm(cred, transport=transport),
        ml_client=lambda cred, sub, o: MLClient(FakeCredential(), sub, o.resource_group, o.workspace, transport=transport),
        run=runner(),
        which=lambda name: f"/usr/bin/{name}" if name == "pulumi" and pulumi else None,
        environ={"ARM_SUBSCRIPTION_ID": SUBSCRIPTION, "PULUMI_CONFIG_PASSPHRASE": "x"} if environ is None else environ)


def by_name(found: list[checks.Check]) -> dict[str, checks.Check]:
    return {c.name: c for c in found}


def diagnose(transport, target_=None, **kwargs) -> dict[str, checks.Check]:
    return by_name(checks.diagnose(target_ or target(), seams(transport, **kwargs), "3.272.0"))


class TestAllGood:
    def test_every_check_passes_and_asks_azure_what_it_should(self):
        transport = azure()
        found = diagnose(transport)
        assert {name: c.status for name, c in found.items()} == {
            "Python": "pass", "stack": "pass", "Pulumi CLI": "pass", "Pulumi backend": "pass", "Azure sign-in": "pass",
            "subscription": "pass", "resource providers": "pass", "roles to deploy": "pass", "roles to submit": "pass",
            "GPU quota": "pass", "submitters": "pass"}
        assert "ada@example.com" in found["Azure sign-in"].found and USER in found["Azure sign-in"].found
        assert "ML research" in found["subscription"].found and "ARM_SUBSCRIPTION_ID" in found["subscription"].found
        assert "Contributor, User Access Administrator" in found["roles to deploy"].found
        urls = [url for _, url in transport.requests]
        assert any("roleAssignments" in u and f"assignedTo%28%27{USER}%27%29" in u.replace("(", "%28").replace(")", "%29")
                   .replace("'", "%27") for u in urls)
        assert any(f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.MachineLearningServices/locations/swedencentral/usages"
                   in u for u in urls)
        assert "nd-a100" not in found["GPU quota"].fix


class TestFailures:
    def test_an_unregistered_provider_names_the_command(self):
        found = diagnose(azure(consumption="NotRegistered", mls="Registering"))
        check = found["resource providers"]
        assert check.status == "fail"
        assert "Microsoft.Consumption (NotRegistered)" in check.found and "Microsoft.MachineLearningServices (Registering)" in check.found
        assert check.fix == "for p in Consumption MachineLearningServices; do az provider register -n Microsoft.$p; done"

    def test_contributor_alone_cannot_deploy_but_can_submit(self):
        found = diagnose(azure(user_role=checks.CONTRIBUTOR, user_scope=RG))
        assert found["roles to deploy"].status == "fail"
        assert "Owner, or Contributor and User Access Administrator" in found["roles to deploy"].found
        assert f"--assignee {USER} --role Owner" in found["roles to deploy"].fix
        assert found["roles to submit"].status == "pass"

    def test_a_role_on_another_resource_group_does_not_count(self):
        found = diagnose(azure(group_role=checks.OWNER, user_role=checks.OWNER,
                               user_scope=f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-amlhpc-prod"))
        assert found["roles to deploy"].status == "pass"  # the group's Owner on rg-amlhpc-dev
        only_other = diagnose(azure(group_role="acdd72a7-3385-48ef-bd42-f606fba81ae7", user_role=checks.OWNER,
                                    user_scope=f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg-amlhpc-prod"))
        assert only_other["roles to deploy"].status == "fail" and only_other["roles to submit"].status == "warn"

    def test_a_submitter_without_the_role_yet_is_told_the_next_up_grants_it(self):
        found = diagnose(azure(group_role="acdd72a7-3385-48ef-bd42-f606fba81ae7", user_role=checks.USER_ACCESS_ADMINISTRATOR))
        assert found["roles to submit"].status == "warn" and "the next `make up STACK=dev` grants" in found["roles to submit"].found
        not_listed = diagnose(azure(group_role="acdd72a7-3385-48ef-bd42-f606fba81ae7",
                                    user_role=checks.USER_ACCESS_ADMINISTRATOR), target(submitters=[GROUP]))
        assert not_listed["roles to submit"].status == "fail" and f"principalId {USER}" in not_listed["roles to submit"].fix

    def test_an_installed_tool_names_its_own_deploy_command(self, monkeypatch):
        from amlhpc.core import invocation

        monkeypatch.setattr(invocation, "from_clone", lambda: False)
        found = diagnose(azure(group_role="acdd72a7-3385-48ef-bd42-f606fba81ae7", user_role=checks.USER_ACCESS_ADMINISTRATOR))
        check = found["roles to submit"]
        assert "the next `aml-hpc infra up dev` grants" in check.found and check.fix == "aml-hpc infra up dev"

    def test_short_quota_fails_with_the_request_to_make(self):
        found = diagnose(azure(quota={"lowpri_used": "300", "lowpri_limit": "400"}))
        check = found["GPU quota"]
        assert check.status == "fail" and "lowPriorityCores needs 216 vCPUs, 100 available" in check.found
        assert "request" in check.fix and "swedencentral" in check.fix

    def test_a_disabled_subscription_stops_the_azure_checks(self):
        found = diagnose(azure(state="Disabled"))
        assert found["subscription"].status == "fail"
        assert [found[n].status for n in ("resource providers", "roles to deploy", "GPU quota")] == ["skip"] * 3

    def test_role_assignments_unreadable_is_a_warning_not_a_guess(self):
        found = diagnose(azure(roles_status=403))
        assert found["roles to deploy"].status == "warn" and "403 AuthorizationFailed" in found["roles to deploy"].found


class TestLocalChecks:
    def test_no_sign_in_skips_what_needs_azure(self):
        error = UserError([Problem("Azure sign-in", "", "no credential could sign in", "run `az login`")])
        found = diagnose(azure(), sign_in_error=error)
        assert found["Azure sign-in"].status == "fail" and found["Azure sign-in"].fix == "run `az login`"
        assert {found[n].status for n in ("subscription", "resource providers", "roles to deploy", "GPU quota")} == {"skip"}
        assert found["submitters"].status == "pass"

    def test_pulumi_missing_and_no_passphrase(self):
        found = diagnose(azure(), pulumi=False)
        assert found["Pulumi CLI"].status == "fail" and "get.pulumi.com" in found["Pulumi CLI"].fix
        assert found["Pulumi backend"].status == "skip"
        no_secret = diagnose(azure(), environ={"ARM_SUBSCRIPTION_ID": SUBSCRIPTION})
        assert no_secret["Pulumi backend"].status == "fail" and "PULUMI_CONFIG_PASSPHRASE" in no_secret["Pulumi backend"].fix

    def test_an_older_cli_than_the_sdk_warns(self):
        s = seams(azure())
        s.run = runner(version="v3.100.0")
        assert checks.pulumi_cli_check(s, "3.272.0").status == "warn"

    def test_no_subscription_chosen(self):
        found = diagnose(azure(), environ={"PULUMI_CONFIG_PASSPHRASE": "x"})
        assert found["subscription"].status == "fail" and "az account set" in found["subscription"].fix

    def test_no_submitters_fails(self):
        found = diagnose(azure(), target(submitters=[]))
        assert found["submitters"].status == "fail" and "aml-hpc:submitters" in found["submitters"].fix

    def test_a_bad_stack_is_reported_and_its_checks_skipped(self):
        bad = UserError([Problem("Pulumi.qa.yaml", "", "stack file not found for stack 'qa'", "stacks here: dev, prod")])
        found = diagnose(azure(), target_=bad)
        assert found["stack"].status == "fail" and "stacks here: dev, prod" in found["stack"].fix
        assert found["resource providers"].status == "skip" and found["submitters"].status == "skip"


@pytest.mark.slow
def test_the_providers_come_from_the_plan_and_every_module_is_known():
    """dev's resources name the providers doctor checks; no module falls back to a guess."""
    from amlhpc.doctor.cli import target as plan_target
    from amlhpc.infra.plan import evaluate

    found = plan_target("dev")
    assert isinstance(found, checks.Target)
    assert {"Microsoft.MachineLearningServices", "Microsoft.Storage", "Microsoft.KeyVault", "Microsoft.ContainerRegistry",
            "Microsoft.ManagedIdentity", "Microsoft.Consumption"} <= set(found.providers)
    modules = {r.type.split(":")[1] for r in evaluate("prod").resources if r.type.startswith("azure-native:")}
    assert modules <= set(checks.PROVIDER_OF_MODULE), modules - set(checks.PROVIDER_OF_MODULE)


def test_the_command_exits_1_when_a_check_fails(monkeypatch):
    from typer.testing import CliRunner

    from amlhpc.doctor import cli

    monkeypatch.setattr(cli, "target", lambda stack: target(submitters=[]))
    monkeypatch.setattr(cli, "seams", lambda: seams(azure()))
    result = CliRunner().invoke(_app(), ["doctor", "--stack", "dev", "--json"])
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert {d["check"]: d["status"] for d in document}["submitters"] == "fail"


def _app():
    import typer

    from amlhpc.doctor.cli import doctor

    app = typer.Typer()
    app.command("doctor")(doctor)
    app.command("noop")(lambda: None)
    return app
