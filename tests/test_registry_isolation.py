"""A private Azure ML registry is private all the way down: private endpoints to the registry,
to the storage account Azure ML creates for it in each region and to its one container
registry, in the subnet of the workspace's endpoint (Microsoft Learn, "Network isolation with
Azure Machine Learning registries", ms.date 2025-04-04); under a managed network the nodes
reach the same three through outbound private endpoint rules. The targets are the ids Azure
reports in the registry's regionDetails, never names guessed from the registry's."""

from __future__ import annotations

from pathlib import Path

import pulumi
import pytest
import yaml

from amlhpc.infra.components.ml_registry import system_created_id
from amlhpc.infra.plan import evaluate
from amlhpc.infra.plan.mocks import FAKE_SUBSCRIPTION, PlanMocks
from tests.test_config import GOOD_ENV, PUBKEY

REGISTRY = "azure-native:machinelearningservices:Registry"
ENDPOINT = "azure-native:network:PrivateEndpoint"
ZONE_GROUP = "azure-native:network:PrivateDnsZoneGroup"
WAY_IN = {"bastion": {}, "jumpBox": {"publicKey": PUBKEY, "logins": [
    {"principalId": "11111111-2222-3333-4444-555555555555", "principalType": "Group"}]}}
STACKS = {
    "priv": {**GOOD_ENV, "aml-hpc:mlRegistry": {"enabled": True, "regions": ["westus3", "swedencentral"]},
             "aml-hpc:network": {"isolation": "private", "addressSpace": "10.50.0.0/16",
                                 "endpointSubnet": "10.50.128.0/18", "wayIn": WAY_IN}},
    "pub": {**GOOD_ENV, "aml-hpc:mlRegistry": {"enabled": True}},
}


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict:
    root: Path = tmp_path_factory.mktemp("stacks")
    for name, config in STACKS.items():
        (root / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": config}))
    return {"prod": evaluate("prod"), **{name: evaluate(name, root) for name in STACKS}}


def answered(plan) -> list[dict]:
    """The registry's regionDetails as the plan's Azure answers them (ids of what Azure ML created)."""
    registry = plan.of_type(REGISTRY)[0]
    return PlanMocks(FAKE_SUBSCRIPTION)._computed(registry.type, registry.inputs, registry.name)["regionDetails"]  # noqa: SLF001


def endpoints_by_target(plan) -> dict[str, tuple[str, str]]:
    """Target id (lower case) -> (group id, endpoint name)."""
    out = {}
    for e in plan.of_type(ENDPOINT):
        connection = e.inputs["privateLinkServiceConnections"][0]
        out[connection["privateLinkServiceId"].lower()] = (connection["groupIds"][0], e.inputs["privateEndpointName"])
    return out


def created_ids(plan) -> tuple[dict[str, str], set[str]]:
    """(region -> storage account id, {container registry ids}) from the registry's answer."""
    storage, acrs = {}, set()
    for region in answered(plan):
        storage[region["location"]] = region["storageAccountDetails"][0]["systemCreatedStorageAccount"][
            "armResourceId"]["resourceId"]
        acrs.add(region["acrDetails"][0]["systemCreatedAcrAccount"]["armResourceId"]["resourceId"])
    return storage, acrs


class TestEndpointsInOurVnet:
    @pytest.mark.parametrize("stack,regions", [("prod", ["eastus", "westus3"]),
                                               ("priv", ["eastus", "westus3", "swedencentral"])])
    def test_each_regions_storage_and_the_acr_get_an_endpoint(self, plans, stack, regions):
        plan = plans[stack]
        storage, acrs = created_ids(plan)
        assert sorted(storage) == sorted(regions) and len(acrs) == 1  # one geo-replicated ACR
        targets = endpoints_by_target(plan)
        for region, account in storage.items():
            assert targets[account.lower()][0] == "blob", region
        assert targets[next(iter(acrs)).lower()][0] == "registry"
        registry_id = PlanMocks(FAKE_SUBSCRIPTION)._arm_id(REGISTRY, plan.of_type(REGISTRY)[0].inputs,  # noqa: SLF001
                                                           plan.of_type(REGISTRY)[0].name)
        assert targets[registry_id.lower()][0] == "amlregistry"

    def test_they_sit_in_the_subnet_of_the_workspace_endpoint(self, plans):
        plan = plans["prod"]
        subnets = {e.inputs["privateEndpointName"]: str(e.inputs["subnet"]["id"]) for e in plan.of_type(ENDPOINT)}
        workspace = next(n for n in subnets if n.endswith("-workspace"))
        registry = [n for n in subnets if "-mlregistry" in n]
        assert len(registry) == 4 and {subnets[n] for n in registry} == {subnets[workspace]}

    def test_each_registers_in_its_private_dns_zone(self, plans):
        plan = plans["prod"]
        zones = {g.inputs["privateEndpointName"]: [c["name"] for c in g.inputs["privateDnsZoneConfigs"]]
                 for g in plan.of_type(ZONE_GROUP)}
        names = {n for n in zones if "-mlregistry" in n}
        assert {zones[n][0] for n in names if "-blob-" in n} == {"privatelink-blob-core-windows-net"}
        assert [zones[n] for n in names if n.endswith("-mlregistry-acr")] == [["privatelink-azurecr-io"]]

    def test_a_public_registry_gets_none(self, plans):
        plan = plans["pub"]
        assert plan.of_type(REGISTRY)[0].inputs["publicNetworkAccess"] == "Enabled"
        assert plan.of_type(ENDPOINT) == []


class TestTheNodesPathUnderApprovedOnlyOutbound:
    def test_outbound_rules_reach_the_registry_its_acr_and_every_regions_storage(self, plans):
        plan = plans["prod"]
        network = plan.of_type("azure-native:machinelearningservices:Workspace")[0].inputs["managedNetwork"]
        assert network["isolationMode"] == "AllowOnlyApprovedOutbound"
        rules = {r["destination"]["serviceResourceId"].lower(): (name, r["destination"]["subresourceTarget"])
                 for name, r in network["outboundRules"].items() if r["type"] == "PrivateEndpoint"}
        storage, acrs = created_ids(plan)
        assert {rules[a.lower()] for a in storage.values()} == {
            ("pe-ml-registry-blob-eastus", "blob"), ("pe-ml-registry-blob-westus3", "blob")}
        assert rules[next(iter(acrs)).lower()] == ("pe-ml-registry-acr", "registry")


class TestSystemCreatedIds:
    DETAILS = [{"location": "East US", "acrDetails": [{"systemCreatedAcrAccount": {
        "armResourceId": {"resourceId": "/acr"}}}], "storageAccountDetails": [{"systemCreatedStorageAccount": {
            "armResourceId": {"resourceId": "/st-eastus"}}}]}]

    def test_found_by_region_whatever_its_spelling(self):
        assert system_created_id(self.DETAILS, "eastus", "storage", "reg") == "/st-eastus"
        assert system_created_id(self.DETAILS, "eastus", "acr", "reg") == "/acr"

    def test_an_answer_without_the_id_is_a_clear_error(self):
        with pytest.raises(pulumi.RunError, match="no system-created storage account for region westus3 of ML "
                                                   "registry reg.*az ml registry show -n reg"):
            system_created_id(self.DETAILS, "westus3", "storage", "reg")
