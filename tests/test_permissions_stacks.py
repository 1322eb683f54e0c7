"""Every role assignment of every shipped and generated stack is a right of the permission
model - the shipped dev and prod, an experiment as `new-experiment` writes it, and the two
every-option environments the conformance tests use - and `python -m amlhpc.infra plan --access`
shows it, with who holds it, where, and why."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from amlhpc.core.permissions import MODEL
from amlhpc.infra.config import REPO_ROOT
from amlhpc.infra.plan import evaluate
from amlhpc.infra.plan.access import access_view
from tests.conformance.conformance_stacks import NOW, write_stacks

ROLE = "azure-native:authorization:RoleAssignment"


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    root = tmp_path_factory.mktemp("stacks")
    return {name: evaluate(name, root, now=NOW) for name in write_stacks(root)}


def test_every_assignment_of_every_stack_is_a_right_of_the_model(stacks):
    assignments = 0
    for name, plan in stacks.items():
        view = access_view(plan)
        assert view["unexplained"] == [], name
        declared = {r.name for r in plan.of_type(ROLE)}
        if plan.config.is_experiment:  # grants nothing; shows its environment's model
            assert declared == set() and "grant nothing" in view["note"]
            continue
        explained = {e["assignment"] for p in view["principals"] for e in p["rights"] if e["assignment"]}
        assert explained == declared, name
        assignments += len(declared)
    assert assignments > 60  # dev, prod and both every-option stacks grant; an experiment grants nothing


def test_the_every_option_stacks_use_every_program_right(stacks):
    """Between them the every-option stacks exercise every right the program grants, so the
    test above covers the whole model, not a corner of it."""
    used = set()
    for plan in (stacks["everything"], stacks["everything-managed"]):
        for principal in access_view(plan)["principals"]:
            used |= {(principal["principal"], e["key"]) for e in principal["rights"] if e["grantedBy"] == "program"}
    expected = set()
    for right in MODEL.rights:
        if right.granted_by == "program":
            expected.add((right.principal, right.resource_key(0) if "{i}" in right.key else right.key))
    assert expected <= used, expected - used


def test_an_assignment_outside_the_model_is_named(stacks):
    plan = stacks["dev"]
    rogue = next(r for r in plan.of_type(ROLE) if r.name == "access-datasets-read")
    original = rogue.inputs["roleDefinitionId"]
    rogue.inputs["roleDefinitionId"] = original.rsplit("/", 1)[0] + "/8e3af657-a8ff-443c-a75c-2fe8c4bcb635"  # Owner
    try:
        (entry,) = access_view(plan)["unexplained"]
        assert entry["assignment"] == "access-datasets-read" and entry["principal"] == "compute"
        assert entry["scope"] == "container:datasets"
    finally:
        rogue.inputs["roleDefinitionId"] = original


class TestCommand:
    def test_prod_access_prints_who_can_do_what_where_and_why(self, stacks):
        from amlhpc.infra.plan.render_access import render_access

        text = render_access(access_view(stacks["prod"]))
        assert "controller: managed-run controller identity (workload)" in text
        assert "aml-hpc managed-run controller on workspace (mlw-amlhpc-prod)" in text
        assert "Storage Blob Data Contributor on container:supervision" in text
        assert "Role Based Access Control Administrator on resource-group (rg-amlhpc-prod)" in text
        assert "condition constrain-roles" in text and "residual risk:" in text
        assert "AzureML Data Scientist" not in text.split("controller: managed-run")[1].split("\n\n")[0]
        assert "NOT IN THE PERMISSION MODEL" not in text
        assert max(len(line) for line in text.splitlines()) <= 80

    def test_prods_view_keeps_teardown_off_the_environments_state(self, stacks):
        """plan --access names each CI identity's state containers: teardown-prod's is its
        experiments' only; prod's deploy identity holds both."""
        view = access_view(stacks["prod"])

        def containers(principal: str) -> list[str]:
            (rights,) = [p["rights"] for p in view["principals"] if p["principal"] == principal]
            return sorted(e["resource"] for e in rights if e["scope"].endswith("state-container"))

        assert containers("teardown") == ["state-prod-experiments"]
        assert containers("deploy") == ["state-prod", "state-prod-experiments"]

    def test_the_command_prints_the_view_as_json(self):
        from typer.testing import CliRunner

        from amlhpc.infra.cli import app

        result = CliRunner().invoke(app, ["plan", "--stack", "prod", "--access", "--json"])
        assert result.exit_code == 0, result.output
        view = json.loads(result.stdout)
        controller = next(p for p in view["principals"] if p["principal"] == "controller")
        assert {e["key"] for e in controller["rights"]} == {"jobs", "supervision-write", "checkpoints-read", "acr-pull",
                                                            "ws-storage"}
        assert view["unexplained"] == [] and view["environment"] == "prod"

    def test_access_with_a_diff_is_refused_by_name(self):
        result = subprocess.run([sys.executable, "-m", "amlhpc.infra", "plan", "--stack", "prod", "--access", "--diff-ref",
                                 "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and "--access" in result.stderr and "drop --diff" in result.stderr
