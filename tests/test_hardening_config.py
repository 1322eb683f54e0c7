"""The hardening options of a stack file: isolation modes, outbound rules, a way in, the
customer-managed key, diagnostics, locks and sizes against regions. Every bad value fails
with the key, the value and the fix (one row per mistake); good ones resolve to what the
program declares."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from amlhpc.core.errors import UserError
from amlhpc.infra.config import DEFAULT_FQDN_RULES, load_stack_config
from tests.plan_helpers import write_stack
from tests.test_config import GOOD_ENV, GOOD_EXP, PUBKEY, mutate

NOW = datetime(2026, 11, 23, tzinfo=UTC)
COSMOS = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


HAND_OFF = {"handOff": {"via": "VPN", "addressPrefixes": ["172.16.0.0/12"]}}
"""People's way in for these stacks (a closed stack needs one; tests/test_way_in.py tests it)."""


def network(**fields) -> dict:
    way_in = {**HAND_OFF, **fields.pop("wayIn", {})}
    return {"isolation": "managed", "addressSpace": "10.40.0.0/16", "wayIn": way_in, **fields}


def load(tmp_path, config: dict, stack: str = "stage"):
    write_stack(tmp_path, stack, config)
    return load_stack_config(stack, tmp_path, now=NOW)


# (id, path to change, new value, fragments the message must contain)
BAD = [
    ("managed with a compute subnet", "aml-hpc:network", network(computeSubnet="10.40.0.0/17"),
     ["aml-hpc:network.computeSubnet", "clusters in a managed network take no subnet"]),
    ("managed without an address space", "aml-hpc:network", {"isolation": "managed"},
     ["aml-hpc:network.addressSpace", "managed isolation needs an address space"]),
    ("unknown isolation", "aml-hpc:network", {"isolation": "vnet"},
     ["aml-hpc:network.isolation", "'vnet'", "'public', 'private' or 'managed'"]),
    ("outbound without managed isolation", "aml-hpc:network",
     {"isolation": "private", "addressSpace": "10.40.0.0/16", "outbound": "AllowOnlyApprovedOutbound"},
     ["aml-hpc:network.outbound", "only used with isolation: managed"]),
    ("unknown outbound mode", "aml-hpc:network", network(outbound="Everything"),
     ["aml-hpc:network.outbound", "'Everything'", "AllowOnlyApprovedOutbound"]),
    ("fqdn rules with internet outbound", "aml-hpc:network",
     network(outbound="AllowInternetOutbound", fqdnRules=["pypi.org"]),
     ["aml-hpc:network.fqdnRules", "only apply with outbound: AllowOnlyApprovedOutbound"]),
    ("firewall with internet outbound", "aml-hpc:network", network(outbound="AllowInternetOutbound", firewallSku="Basic"),
     ["aml-hpc:network.firewallSku", "only matters for FQDN rules"]),
    ("firewall without rules", "aml-hpc:network", network(fqdnRules=[], firewallSku="Basic"),
     ["aml-hpc:network.firewallSku", "no FQDN rules"]),
    ("rule with a scheme", "aml-hpc:network", network(fqdnRules=["https://pypi.org/simple"]),
     ["aml-hpc:network.fqdnRules[0]", "not a host name", "80 and 443"]),
    ("rule not a host", "aml-hpc:network", network(fqdnRules=["pypi"]),
     ["aml-hpc:network.fqdnRules[0]", "'pypi' is not a fully qualified host name"]),
    ("rule to storage", "aml-hpc:network", network(fqdnRules=["mydata.blob.core.windows.net"]),
     ["aml-hpc:network.fqdnRules[0]", "Azure Storage endpoint", "private endpoint"]),
    ("rule twice", "aml-hpc:network", network(fqdnRules=["pypi.org", "PyPI.org"]),
     ["aml-hpc:network.fqdnRules[1]", "listed twice"]),
    # A wildcard lets jobs send data to any bucket or tunnel anyone can create under it.
    ("wildcard rule to a cloud's storage", "aml-hpc:network", network(fqdnRules=["pypi.org", "*.amazonaws.com"]),
     ["aml-hpc:network.fqdnRules[1]", "'*.amazonaws.com' is a wildcard", "every host under 'amazonaws.com'",
      "list the exact hosts jobs need"]),
    ("wildcard rule to a tunnel service", "aml-hpc:network", network(fqdnRules=["*.ngrok.io"]),
     ["aml-hpc:network.fqdnRules[0]", "'*.ngrok.io' is a wildcard", "list the exact hosts jobs need"]),
    ("way in to a public stack", "aml-hpc:network", {"isolation": "public", "wayIn": {"ciRunners": {}}},
     ["aml-hpc:network.wayIn", "public stack needs no way in"]),
    ("bastion without a jump box", "aml-hpc:network", network(wayIn={"bastion": {}}),
     ["aml-hpc:network.wayIn.bastion", "connects to a VM", "jumpBox.publicKey"]),
    ("jump box without a key", "aml-hpc:network", network(wayIn={"jumpBox": {}}),
     ["aml-hpc:network.wayIn.jumpBox.publicKey", "no public key"]),
    ("jump box with a private key", "aml-hpc:network",
     network(wayIn={"jumpBox": {"publicKey": "-----BEGIN OPENSSH PRIVATE KEY-----"}}),
     ["aml-hpc:network.wayIn.jumpBox.publicKey", "private key", "rotate it"]),
    ("jump box as root", "aml-hpc:network", network(wayIn={"jumpBox": {"publicKey": PUBKEY, "adminUser": "root"}}),
     ["aml-hpc:network.wayIn.jumpBox.adminUser", "'root'"]),
    ("jump box size", "aml-hpc:network", network(wayIn={"jumpBox": {"publicKey": PUBKEY, "size": "D2s v5"}}),
     ["aml-hpc:network.wayIn.jumpBox.size", "'D2s v5' is not an Azure VM size name"]),
    ("misspelt way-in key", "aml-hpc:network", network(wayIn={"jumpbox": {}}),
     ["aml-hpc:network.wayIn.jumpbox", "unknown key 'jumpbox'", "did you mean 'jumpBox'"]),
    ("no room for the way in", "aml-hpc:network",
     {"isolation": "private", "addressSpace": "10.40.0.0/16", "wayIn": {"ciRunners": {}}},
     ["aml-hpc:network.wayIn.ciRunners", "no free /27", "endpointSubnet", "10.40.128.0/18"]),
    ("bastion subnet too small", "aml-hpc:network",
     network(wayIn={"bastion": {"subnet": "10.40.0.0/27"}, "jumpBox": {"publicKey": PUBKEY}}),
     ["aml-hpc:network.wayIn.bastion.subnet", "too small for the Bastion subnet", "/26"]),
    ("way-in subnet outside the space", "aml-hpc:network", network(wayIn={"ciRunners": {"subnet": "10.99.0.0/27"}}),
     ["aml-hpc:network.wayIn.ciRunners.subnet", "outside addressSpace 10.40.0.0/16"]),
    ("way-in subnet on the endpoints", "aml-hpc:network", network(wayIn={"ciRunners": {"subnet": "10.40.128.0/27"}}),
     ["aml-hpc:network.wayIn.ciRunners.subnet", "overlaps 10.40.128.0/17"]),
    ("way-in subnet not a CIDR", "aml-hpc:network", network(wayIn={"ciRunners": {"subnet": "10.40.0.1/27"}}),
     ["aml-hpc:network.wayIn.ciRunners.subnet", "not a valid CIDR block"]),
    ("key without the Cosmos DB principal", "aml-hpc:encryption", {"customerManagedKey": True},
     ["aml-hpc:encryption.cosmosDbPrincipalId", "Azure Cosmos DB",
      "az ad sp show --id a232010e-820c-4083-83bb-3ace5fc29d0b"]),
    ("Cosmos DB principal not a GUID", "aml-hpc:encryption", {"customerManagedKey": True, "cosmosDbPrincipalId": "cosmos"},
     ["aml-hpc:encryption.cosmosDbPrincipalId", "'cosmos' is not an Entra object id"]),
    ("Cosmos DB principal without a key", "aml-hpc:encryption", {"cosmosDbPrincipalId": COSMOS},
     ["aml-hpc:encryption.cosmosDbPrincipalId", "only used with customerManagedKey: true"]),
    ("short key", "aml-hpc:encryption", {"customerManagedKey": True, "cosmosDbPrincipalId": COSMOS, "keySize": 2048},
     ["aml-hpc:encryption.keySize", "2048", "3072 or 4096"]),
    ("short log retention", "aml-hpc:diagnostics", {"retentionDays": 7},
     ["aml-hpc:diagnostics.retentionDays", "7", "greater than or equal to 30"]),
    ("hbi not a flag", "aml-hpc:hbiWorkspace", "sometimes",
     ["aml-hpc:hbiWorkspace", "'sometimes'", "boolean"]),
    ("lock not a flag", "aml-hpc:locks", {"datasetStorage": "maybe"},
     ["aml-hpc:locks.datasetStorage", "'maybe'"]),
    ("ssh into a managed network", "aml-hpc:clusters/0/ssh", {"publicKey": PUBKEY},
     ["aml-hpc:clusters[0].ssh", "cannot be reached by SSH", "isolation: private"]),
    ("size not offered in the region", "azure-native:location", "brazilsouth",
     ["aml-hpc:clusters[0].sku", "Standard_ND96asr_v4 is not offered in brazilsouth", "regions that offer it",
      "eastus", "availability.toml", "az vm list-skus"]),
    ("retired size", "aml-hpc:clusters/0/sku", "Standard_NC24s_v3",
     ["aml-hpc:clusters[0].sku", "Standard_NC24s_v3 was retired on 2025-09-30", "use Standard_NC96ads_A100_v4 instead"]),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_hardening_config_is_refused_with_key_value_and_fix(tmp_path, case):
    name, path, value, fragments = case
    base = mutate(GOOD_ENV, "aml-hpc:network", network()) if "managed network" in name else GOOD_ENV
    with pytest.raises(UserError) as info:
        load(tmp_path, mutate(base, path, value))
    message = info.value.render()
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert "Pulumi.stage.yaml" in message and "fix:" in message


@pytest.mark.parametrize("key,value", [("encryption", {"customerManagedKey": True}), ("hbiWorkspace", True),
                                       ("diagnostics", {}), ("locks", {"datasetStorage": True})])
def test_hardening_belongs_to_the_environment(tmp_path, key, value):
    config = {**GOOD_EXP, f"aml-hpc:{key}": value}
    with pytest.raises(UserError) as info:
        load(tmp_path, config, stack="exp-sweep")
    assert f"aml-hpc:{key}: belongs to the environment stack" in info.value.render()


class TestResolved:
    def test_managed_defaults(self, tmp_path):
        cfg = load(tmp_path, mutate(GOOD_ENV, "aml-hpc:network", network()))
        assert cfg.compute_subnet is None and cfg.endpoint_subnet == "10.40.128.0/17"
        assert cfg.managed_network is not None
        assert cfg.managed_network.outbound == "AllowOnlyApprovedOutbound"
        assert cfg.managed_network.fqdn_rules == tuple(DEFAULT_FQDN_RULES) and cfg.managed_network.firewall_sku == "Standard"

    def test_no_fqdn_rules_means_no_firewall(self, tmp_path):
        cfg = load(tmp_path, mutate(GOOD_ENV, "aml-hpc:network", network(fqdnRules=[])))
        assert cfg.managed_network.fqdn_rules == () and cfg.managed_network.firewall_sku is None

    def test_internet_outbound_has_no_rules(self, tmp_path):
        cfg = load(tmp_path, mutate(GOOD_ENV, "aml-hpc:network", network(outbound="AllowInternetOutbound")))
        assert cfg.managed_network.fqdn_rules == () and cfg.managed_network.firewall_sku is None

    def test_hosts_are_normalised(self, tmp_path):
        cfg = load(tmp_path, mutate(GOOD_ENV, "aml-hpc:network", network(fqdnRules=[" Conda.Anaconda.org "],
                                                                          firewallSku="Basic")))
        assert cfg.managed_network.fqdn_rules == ("conda.anaconda.org",) and cfg.managed_network.firewall_sku == "Basic"

    def test_the_default_list_holds_no_code_host(self, tmp_path):
        """github.com (and any host where a job could push data) is not a default: a team adds
        what it needs, reviewed (docs/isolation.md)."""
        cfg = load(tmp_path, mutate(GOOD_ENV, "aml-hpc:network", network()))
        assert cfg.managed_network.fqdn_rules == ("pypi.org", "files.pythonhosted.org")

    def test_way_in_takes_fixed_slots_of_the_free_space(self, tmp_path):
        every = load(tmp_path, mutate(GOOD_ENV, "aml-hpc:network", network(
            wayIn={"bastion": {"sku": "Basic"}, "jumpBox": {"publicKey": PUBKEY}, "ciRunners": {}})))
        assert (every.way_in.bastion, every.way_in.jump_box, every.way_in.ci_runners) == (
            "10.40.0.0/26", "10.40.0.64/28", "10.40.0.96/27")
        assert every.way_in.bastion_sku == "Basic"
        # Declaring less moves nothing: a later Bastion will not displace the jump box.
        runners_only = load(tmp_path, mutate(GOOD_ENV, "aml-hpc:network", network(wayIn={"ciRunners": {}})))
        assert runners_only.way_in.ci_runners == "10.40.0.96/27" and runners_only.way_in.bastion is None

    def test_explicit_subnets_win_and_defaults_fill_around_them(self, tmp_path):
        cfg = load(tmp_path, mutate(GOOD_ENV, "aml-hpc:network", network(
            wayIn={"jumpBox": {"publicKey": PUBKEY, "subnet": "10.40.0.0/28"}, "ciRunners": {}})))
        assert cfg.way_in.jump_box == "10.40.0.0/28" and cfg.way_in.ci_runners == "10.40.0.32/27"

    def test_private_isolation_with_room_for_a_way_in(self, tmp_path):
        cfg = load(tmp_path, mutate(GOOD_ENV, "aml-hpc:network", {
            "isolation": "private", "addressSpace": "10.40.0.0/16", "endpointSubnet": "10.40.128.0/18",
            "wayIn": {"ciRunners": {}, **HAND_OFF}}))
        assert cfg.compute_subnet == "10.40.0.0/17" and cfg.way_in.ci_runners == "10.40.192.96/27"

    def test_key_diagnostics_hbi(self, tmp_path):
        cfg = load(tmp_path, {**GOOD_ENV, "aml-hpc:encryption": {"customerManagedKey": True, "cosmosDbPrincipalId": COSMOS},
                              "aml-hpc:diagnostics": {"retentionDays": 90}, "aml-hpc:hbiWorkspace": True})
        assert cfg.encryption.customer_managed_key and cfg.encryption.key_size == 3072
        assert cfg.diagnostics.retention_days == 90 and not cfg.diagnostics.storage_reads and cfg.hbi_workspace

    def test_diagnostics_can_be_declared_off(self, tmp_path):
        assert load(tmp_path, {**GOOD_ENV, "aml-hpc:diagnostics": {"enabled": False}}).diagnostics is None

    @pytest.mark.parametrize("stack,overrides,locked", [
        ("dev", {}, False), ("stage", {}, True), ("stage", {"aml-hpc:protectData": False}, False),
        ("stage", {"aml-hpc:locks": {"datasetStorage": False}}, False), ("dev", {"aml-hpc:locks": {"datasetStorage": True}}, True),
    ])
    def test_the_dataset_lock_follows_protection_unless_told(self, tmp_path, stack, overrides, locked):
        assert load(tmp_path, {**GOOD_ENV, **overrides}, stack=stack).lock_dataset_storage is locked

    def test_a_current_size_passes_and_a_retired_one_does_not(self, tmp_path):
        current = mutate(GOOD_ENV, "aml-hpc:clusters/0", {"name": "nca100", "sku": "Standard_NC24ads_A100_v4", "maxNodes": 1})
        write_stack(tmp_path, "stage", current)
        assert load_stack_config("stage", tmp_path, now=NOW).clusters[0].sku == "Standard_NC24ads_A100_v4"
        config = mutate(mutate(GOOD_ENV, "aml-hpc:clusters/0/sku", "Standard_NC24rs_v3"), "aml-hpc:clusters/0/maxNodes", 2)
        write_stack(tmp_path, "stage", config)
        with pytest.raises(UserError, match="Standard_NC24rs_v3 was retired on 2025-09-30"):
            load_stack_config("stage", tmp_path, now=NOW)


# A cluster may accept a region amlhpc/core/catalog/availability.toml does not list (the lists are a
# snapshot): (id, region, size, allowUnlistedRegion, None when accepted / fragments of the refusal)
REGION_OPT_IN = [
    ("unlisted region, no opt-in", "brazilsouth", "Standard_ND96asr_v4", None,
     ["aml-hpc:clusters[0].sku", "not offered in brazilsouth", "allowUnlistedRegion: true", "az vm list-skus"]),
    ("unlisted region, opted in", "brazilsouth", "Standard_ND96asr_v4", True, None),
    ("unlisted region, opt-in off", "brazilsouth", "Standard_ND96asr_v4", False,
     ["not offered in brazilsouth", "allowUnlistedRegion: true"]),
    ("listed region, opted in anyway", "eastus", "Standard_ND96asr_v4", True, None),
    ("retired size, opted in", "eastus", "Standard_NC24s_v3", True,
     ["aml-hpc:clusters[0].sku", "Standard_NC24s_v3 was retired on 2025-09-30", "use Standard_NC96ads_A100_v4"]),
    ("retired size, unlisted region, opted in", "brazilsouth", "Standard_NC24rs_v3", True,
     ["Standard_NC24rs_v3 was retired"]),
    ("opt-in not a flag", "brazilsouth", "Standard_ND96asr_v4", "yes please",
     ["aml-hpc:clusters[0].allowUnlistedRegion", "'yes please'"]),
]


@pytest.mark.parametrize("case", REGION_OPT_IN, ids=[c[0] for c in REGION_OPT_IN])
def test_a_cluster_can_opt_in_to_an_unlisted_region_but_never_to_a_retired_size(tmp_path, case):
    _, region, size, opt_in, refused = case
    cluster = {"name": "nd-a100", "sku": size, "maxNodes": 1}
    if opt_in is not None:
        cluster["allowUnlistedRegion"] = opt_in
    config = {**GOOD_ENV, "azure-native:location": region, "aml-hpc:clusters": [cluster]}
    if refused is None:
        cfg = load(tmp_path, config)
        assert cfg.clusters[0].allow_unlisted_region is bool(opt_in)
        return
    with pytest.raises(UserError) as info:
        load(tmp_path, config)
    message = info.value.render()
    for fragment in refused:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert "Pulumi.stage.yaml" in message and "fix:" in message


def test_an_experiment_copies_the_opt_in_with_the_cluster(tmp_path):
    from amlhpc.infra.lifecycle import new_experiment

    cluster = {"name": "nd-a100", "sku": "Standard_ND96asr_v4", "maxNodes": 2, "allowUnlistedRegion": True}
    write_stack(tmp_path, "brz", {**GOOD_ENV, "azure-native:location": "brazilsouth", "aml-hpc:clusters": [cluster]})
    path = new_experiment("sweep", "brz", 3, tmp_path, now=NOW)
    experiment = load_stack_config("exp-sweep", tmp_path, now=NOW)
    assert experiment.clusters[0].allow_unlisted_region and "allowUnlistedRegion: true" in path.read_text()
