"""The plan says who can reach what, from where, and it is derived from the declared resources:
take a private endpoint or an outbound rule away and the path it gave is gone."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime

import pytest
import yaml
from typer.testing import CliRunner

from amlhpc.infra.cli import app
from amlhpc.infra.plan import evaluate
from amlhpc.infra.plan.reachability import reachability
from amlhpc.infra.plan.render import render
from tests.test_config import GOOD_ENV, PUBKEY

NOW = datetime(2026, 11, 23, tzinfo=UTC)
TARGETS = ["workspace", "studio", "workspace storage", "key vault", "container registry", "dataset storage",
           "ML registry", "ML registry storage (eastus)", "ML registry storage (westus3)", "ML registry ACR"]


@pytest.fixture(scope="module")
def prod():
    return evaluate("prod", now=NOW)


@pytest.fixture(scope="module")
def private(tmp_path_factory):
    root = tmp_path_factory.mktemp("private")
    config = {**GOOD_ENV, "aml-hpc:mlRegistry": {"enabled": True},
              "aml-hpc:network": {"isolation": "private", "addressSpace": "10.50.0.0/16",
                                                  "endpointSubnet": "10.50.128.0/18", "wayIn": {
                  "bastion": {}, "jumpBox": {"publicKey": PUBKEY},
                  "handOff": {"via": "ExpressRoute", "addressPrefixes": ["172.16.0.0/12"]}}}}
    (root / "Pulumi.lab.yaml").write_text(yaml.safe_dump({"config": config}))
    return evaluate("lab", root, now=NOW)


def paths(plan) -> dict[str, dict[str, tuple[bool, str]]]:
    return {r.target: {o: (p.reachable, p.how) for o, p in r.paths.items()} for r in reachability(plan).reaches}


def without(plan, drop):
    """The plan with the resources `drop` selects removed (what the program would declare without them)."""
    other = copy.copy(plan)
    other.resources = [r for r in plan.resources if not drop(r)]
    return other


class TestProd:
    def test_nothing_from_the_internet_everything_from_our_vnet_and_the_nodes(self, prod):
        found = paths(prod)
        assert list(found) == TARGETS
        for target, by_origin in found.items():
            assert by_origin["internet"][0] is False, target
            assert by_origin["our VNet"][0] is True, target
            if target != "studio":
                assert by_origin["nodes"][0] is True, target

    def test_the_registrys_storage_and_acr_through_private_endpoints_and_outbound_rules(self, prod):
        found = paths(prod)
        acr = found["ML registry ACR"]
        assert acr["our VNet"][1] == "private endpoint pe-amlhpc-prod-mlregistry-acr (registry)"
        assert acr["nodes"][1] == "managed private endpoint, rule pe-ml-registry-acr (registry)"
        assert "follows the registry's publicNetworkAccess: Disabled" in acr["internet"][1]
        assert found["ML registry storage (westus3)"]["nodes"][1] == (
            "managed private endpoint, rule pe-ml-registry-blob-westus3 (blob)")
        assert found["key vault"]["nodes"][1] == "managed private endpoint Azure adds (a required rule)"

    def test_the_ways_in_are_the_declared_seats(self, prod):
        ways = reachability(prod).ways_in
        assert ways[0].startswith("Azure Bastion bas-amlhpc-prod (the only public IP")
        assert ways[1].startswith("jump box vm-amlhpc-prod-jump-box (no public IP; Entra ID sign-in for 0")
        assert ways[2].startswith("CI runners subnet 10.40.0.96/27")


class TestDerivedFromTheResources:
    def test_without_its_private_endpoint_the_acr_is_out_of_reach_from_our_vnet(self, prod):
        cut = without(prod, lambda r: r.inputs.get("privateEndpointName") == "pe-amlhpc-prod-mlregistry-acr")
        assert paths(cut)["ML registry ACR"]["our VNet"] == (
            False, "no: no private endpoint here and public network access off")

    def test_without_its_outbound_rule_the_nodes_cannot_reach_it(self, prod):
        cut = copy.copy(prod)
        cut.resources = [copy.deepcopy(r) if r.type.endswith(":Workspace") else r for r in prod.resources]
        ws = next(r for r in cut.resources if r.type == "azure-native:machinelearningservices:Workspace")
        del ws.inputs["managedNetwork"]["outboundRules"]["pe-ml-registry-blob-eastus"]
        assert paths(cut)["ML registry storage (eastus)"]["nodes"] == (
            False, "no: no outbound rule to it (approved outbound only)")

    def test_studio_needs_the_storage_file_endpoint_too(self, prod):
        cut = without(prod, lambda r: r.inputs.get("privateEndpointName") == "pe-amlhpc-prod-ws-file")
        assert paths(cut)["studio"]["our VNet"][0] is False

    def test_no_seat_is_said_plainly(self, prod):
        cut = without(prod, lambda r: r.type in ("azure-native:network:BastionHost", "azure-native:compute:VirtualMachine")
                      or r.inputs.get("subnetName") == "ci-runners")
        assert reachability(cut).ways_in == ["NONE: nobody can reach this stack's private endpoints"]


class TestOtherStacks:
    def test_our_vnet_serves_people_and_nodes_alike(self, private):
        found = paths(private)
        assert found["ML registry ACR"]["nodes"] == found["ML registry ACR"]["our VNet"]
        assert found["ML registry ACR"]["nodes"][1].startswith("private endpoint pe-amlhpc-lab-mlregistry-acr")
        assert any(w.startswith("ExpressRoute hand-off from 172.16.0.0/12") for w in reachability(private).ways_in)

    def test_a_public_stack_is_public_and_says_so(self):
        dev = evaluate("dev", now=NOW)
        found = paths(dev)
        assert all(set(by_origin) <= {"internet", "nodes"} for by_origin in found.values())
        assert found["workspace"]["internet"] == (True, "public endpoint, Entra ID sign-in")
        assert reachability(dev).ways_in == ["none needed: public network access, Entra ID sign-in from anywhere"]


class TestInThePlan:
    def test_the_text_plan_has_the_section(self, prod):
        text = render(prod)
        section = text[text.index("Who can reach what, from where"):]
        assert "  ML registry ACR  " in section
        assert "from nodes: managed private endpoint, rule pe-ml-registry-acr (registry)" in section
        assert all(len(line) <= 80 for line in section.splitlines())

    def test_the_json_plan_has_it_too(self):
        result = CliRunner().invoke(app, ["plan", "--stack", "prod", "--json"])
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)["reachability"]
        acr = next(t for t in document["targets"] if t["target"] == "ML registry ACR")
        assert acr["from"]["internet"]["reachable"] is False and acr["from"]["nodes"]["reachable"] is True
