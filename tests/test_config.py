"""Stack config validation: every bad value fails with the file, the key, the value, what
is allowed and the fix - before any resource exists. Table-driven: one row per mistake."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest

from amlhpc.core.errors import UserError
from amlhpc.infra.config import load_stack_config, parse, read_stack_file
from tests.plan_helpers import write_stack

GOOD_ENV = {
    "azure-native:location": "eastus",
    "aml-hpc:owner": "team@example.com",
    "aml-hpc:clusters": [{"name": "nd-a100", "sku": "Standard_ND96asr_v4", "maxNodes": 4}],
    "aml-hpc:budget": {"monthlyAmountUsd": 1000, "alertEmails": ["team@example.com"]},
}
GOOD_EXP = {
    "azure-native:location": "eastus",
    "aml-hpc:owner": "team@example.com",
    "aml-hpc:environment": "dev",
    "aml-hpc:expiresAt": "2026-12-31T00:00:00Z",
    "aml-hpc:clusters": [{"name": "sweep", "sku": "Standard_ND96asr_v4", "maxNodes": 2}],
}
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBHk3Nw2Qz3q8e6tW1zM2xX0f9Yx7m1o5J4nKqLw0bVx user@host"


def mutate(base: dict, path: str, value) -> dict:
    """Copy `base` and set a dotted path (list indexes as numbers); value DELETE removes it."""
    cfg = copy.deepcopy(base)
    *parents, last = path.split("/")
    node = cfg
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return cfg


DELETE = object()

# (id, stack, base, path to change, new value, fragments the message must contain)
BAD = [
    ("unknown sku", "dev", GOOD_ENV, "aml-hpc:clusters/0/sku", "Standard_ND96asr_v5",
     ["aml-hpc:clusters[0].sku", "'Standard_ND96asr_v5'", "did you mean Standard_ND96asr_v4"]),
    ("multi-node without infiniband", "dev", GOOD_ENV, "aml-hpc:clusters/0/sku", "Standard_NC24ads_A100_v4",
     ["aml-hpc:clusters[0].sku", "Standard_NC24ads_A100_v4 has no InfiniBand", "4 nodes", "allowTcpMultiNode"]),
    ("max below min", "dev", GOOD_ENV, "aml-hpc:clusters/0",
     {"name": "nd-a100", "sku": "Standard_ND96asr_v4", "minNodes": 3, "maxNodes": 2, "allowIdleNodes": True},
     ["aml-hpc:clusters[0].maxNodes", "maxNodes 2 is below minNodes 3"]),
    ("idle nodes without opt-in", "dev", GOOD_ENV, "aml-hpc:clusters/0",
     {"name": "nd-a100", "sku": "Standard_ND96asr_v4", "minNodes": 1, "maxNodes": 2},
     ["aml-hpc:clusters[0].minNodes", "keeps nodes running while idle", "$653/day", "allowIdleNodes"]),
    ("storage account name", "dev", GOOD_ENV, "aml-hpc:names", {"datasetStorageAccount": "My_Data"},
     ["aml-hpc:names.datasetStorageAccount", "'My_Data'", "3-24 lowercase letters and digits"]),
    ("storage account too long", "dev", GOOD_ENV, "aml-hpc:names", {"datasetStorageAccount": "a" * 25},
     ["aml-hpc:names.datasetStorageAccount", "25 characters long"]),
    ("cluster name too short", "dev", GOOD_ENV, "aml-hpc:clusters/0/name", "g",
     ["aml-hpc:clusters[0].name", "'g' is 1 characters long", "3-24 letters"]),
    ("cluster name too long", "dev", GOOD_ENV, "aml-hpc:clusters/0/name", "a-very-long-cluster-name-x",
     ["aml-hpc:clusters[0].name", "26 characters long"]),
    ("cluster name ends in a number after a hyphen", "dev", GOOD_ENV, "aml-hpc:clusters/0/name", "sweep-2",
     ["aml-hpc:clusters[0].name", "no letter after its last hyphen", "sweep-v2"]),
    ("too many budget notifications", "dev", GOOD_ENV, "aml-hpc:budget",
     {"monthlyAmountUsd": 10, "alertEmails": ["a@example.com"], "thresholdsPercent": [10, 20, 30, 40, 50]},
     ["aml-hpc:budget.thresholdsPercent", "6 notifications", "at most 5"]),
    ("name suffix", "dev", GOOD_ENV, "aml-hpc:nameSuffix", "AB_1",
     ["aml-hpc:nameSuffix", "'AB_1'", "4-8 lowercase letters and digits", "python -m amlhpc.infra.adopt suffix"]),
    ("submitter not a guid", "dev", GOOD_ENV, "aml-hpc:submitters", [{"principalId": "alice"}],
     ["aml-hpc:submitters[0].principalId", "not an Entra object id"]),
    ("workspace storage auth", "dev", GOOD_ENV, "aml-hpc:workspaceStorageAuth", "keys",
     ["aml-hpc:workspaceStorageAuth", "'keys'"]),
    ("key vault name", "dev", GOOD_ENV, "aml-hpc:names", {"keyVault": "kv--x"},
     ["aml-hpc:names.keyVault", "'kv--x'", "single hyphens"]),
    ("registry name", "dev", GOOD_ENV, "aml-hpc:names", {"containerRegistry": "my-acr"},
     ["aml-hpc:names.containerRegistry", "'my-acr'", "5-50 letters and digits"]),
    ("name prefix", "dev", GOOD_ENV, "aml-hpc:namePrefix", "AML_HPC",
     ["aml-hpc:namePrefix", "'AML_HPC'", "lowercase letters and digits"]),
    ("ssh without key", "dev", GOOD_ENV, "aml-hpc:clusters/0/ssh", {"enabled": True},
     ["aml-hpc:clusters[0].ssh.publicKey", "SSH is enabled but no public key", "id_ed25519.pub"]),
    ("ssh with password", "dev", GOOD_ENV, "aml-hpc:clusters/0/ssh", {"publicKey": PUBKEY, "password": "hunter2"},
     ["aml-hpc:clusters[0].ssh.password", "password login is never enabled"]),
    ("ssh private key", "dev", GOOD_ENV, "aml-hpc:clusters/0/ssh",
     {"publicKey": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk=\n-----END OPENSSH PRIVATE KEY-----"},
     ["aml-hpc:clusters[0].ssh.publicKey", "this is a private key", "rotate it"]),
    ("ssh garbage key", "dev", GOOD_ENV, "aml-hpc:clusters/0/ssh", {"publicKey": "not a key"},
     ["aml-hpc:clusters[0].ssh.publicKey", "not an OpenSSH public key line"]),
    ("private without address space", "dev", GOOD_ENV, "aml-hpc:network", {"isolation": "private"},
     ["aml-hpc:network.addressSpace", "private isolation needs an address space", "10.40.0.0/16"]),
    ("invalid cidr", "dev", GOOD_ENV, "aml-hpc:network", {"isolation": "private", "addressSpace": "10.40.0.1/16"},
     ["aml-hpc:network.addressSpace", "'10.40.0.1/16' is not a valid CIDR block"]),
    ("public cidr", "dev", GOOD_ENV, "aml-hpc:network", {"isolation": "private", "addressSpace": "8.8.0.0/16"},
     ["aml-hpc:network.addressSpace", "not a private IPv4 range"]),
    ("budget without email", "dev", GOOD_ENV, "aml-hpc:budget", {"monthlyAmountUsd": 100},
     ["aml-hpc:budget.alertEmails", "a budget needs at least one email"]),
    ("budget bad email", "dev", GOOD_ENV, "aml-hpc:budget", {"monthlyAmountUsd": 100, "alertEmails": ["nobody"]},
     ["aml-hpc:budget.alertEmails[0]", "'nobody' is not an email address"]),
    ("malformed expiresAt", "exp-test", GOOD_EXP, "aml-hpc:expiresAt", "next tuesday",
     ["Pulumi.exp-test.yaml", "aml-hpc:expiresAt", "'next tuesday' is not an ISO 8601 date", "2026-12-31"]),
    ("experiment without expiresAt", "exp-test", GOOD_EXP, "aml-hpc:expiresAt", DELETE,
     ["aml-hpc:expiresAt", "is required on experiment stacks"]),
    ("experiment without environment", "exp-test", GOOD_EXP, "aml-hpc:environment", DELETE,
     ["aml-hpc:environment", "is required on experiment stacks"]),
    ("experiment owning storage", "exp-test", GOOD_EXP, "aml-hpc:storage", {"tier": "PremiumBlockBlob"},
     ["aml-hpc:storage", "belongs to the environment stack"]),
    ("expiresAt on environment", "dev", GOOD_ENV, "aml-hpc:expiresAt", "2026-12-31",
     ["aml-hpc:expiresAt", "only for experiment stacks"]),
    ("unknown key typo", "dev", GOOD_ENV, "aml-hpc:clustrs", [],
     ["aml-hpc:clustrs", "unknown key 'clustrs'", "did you mean 'aml-hpc:clusters'"]),
    ("unknown nested key", "dev", GOOD_ENV, "aml-hpc:clusters/0/maxNode", 3,
     ["aml-hpc:clusters[0].maxNode", "unknown key 'maxNode'", "did you mean 'maxNodes'"]),
    ("wrong type", "dev", GOOD_ENV, "aml-hpc:clusters/0/maxNodes", "four",
     ["aml-hpc:clusters[0].maxNodes", "'four'", "valid integer", "pulumi config set --path"]),
    ("bad priority", "dev", GOOD_ENV, "aml-hpc:clusters/0/priority", "Spot",
     ["aml-hpc:clusters[0].priority", "'Spot'", "Dedicated", "LowPriority"]),
    ("display-name region", "dev", GOOD_ENV, "azure-native:location", "East US",
     ["azure-native:location", "'East US' is not an Azure region's programmatic name", "did you mean eastus"]),
    ("missing owner", "dev", GOOD_ENV, "aml-hpc:owner", DELETE,
     ["aml-hpc:owner", "is required"]),
    ("duplicate cluster", "dev", GOOD_ENV, "aml-hpc:clusters",
     [{"name": "gpu", "sku": "Standard_ND96asr_v4", "maxNodes": 2}, {"name": "GPU", "sku": "Standard_ND96asr_v4", "maxNodes": 2}],
     ["aml-hpc:clusters[1].name", "duplicate cluster name 'GPU'"]),
    ("price for unknown sku", "dev", GOOD_ENV, "aml-hpc:prices", {"Standard_ND96isr_H200": 100.0},
     ["aml-hpc:prices.Standard_ND96isr_H200", "unknown VM size", "Standard_ND96isr_H200_v5"]),
    ("principal not a guid", "dev", GOOD_ENV, "aml-hpc:storage", {"dataContributors": [{"principalId": "me"}]},
     ["aml-hpc:storage.dataContributors[0].principalId", "'me' is not an Entra object id"]),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_config_message(tmp_path, case):
    _, stack, base, path, value, fragments = case
    write_stack(tmp_path, stack, mutate(base, path, value))
    with pytest.raises(UserError) as info:
        load_stack_config(stack, tmp_path)
    message = info.value.render()
    assert f"Pulumi.{stack}.yaml" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert "fix:" in message


class TestGoodConfigs:
    def test_repo_stacks_load(self):
        dev, prod = load_stack_config("dev"), load_stack_config("prod")
        assert dev.kind == prod.kind == "environment"
        assert dev.protect_data is False and prod.protect_data is True
        assert prod.network.isolation == "managed" and prod.compute_subnet is None
        assert prod.endpoint_subnet == "10.40.128.0/17"

    def test_opt_ins_make_the_flagged_cases_valid(self, tmp_path):
        config = mutate(GOOD_ENV, "aml-hpc:clusters/0", {
            "name": "nca100", "sku": "Standard_NC24ads_A100_v4", "minNodes": 1, "maxNodes": 4,
            "allowIdleNodes": True, "allowTcpMultiNode": True})
        write_stack(tmp_path, "dev", config)
        assert load_stack_config("dev", tmp_path).clusters[0].min_nodes == 1

    def test_sku_spelling_is_canonicalised(self, tmp_path):
        write_stack(tmp_path, "dev", mutate(GOOD_ENV, "aml-hpc:clusters/0/sku", "standard_nd96asr_v4"))
        assert load_stack_config("dev", tmp_path).clusters[0].sku == "Standard_ND96asr_v4"

    def test_experiment_tags_carry_expiry(self, tmp_path):
        write_stack(tmp_path, "exp-test", GOOD_EXP)
        cfg = load_stack_config("exp-test", tmp_path)
        assert cfg.is_experiment and cfg.environment == "dev"
        assert cfg.environment_stack == "organization/aml-hpc/dev"
        assert cfg.expires_at == datetime(2026, 12, 31, tzinfo=UTC)
        assert cfg.tags()["expiresAt"] == "2026-12-31T00:00:00Z"

    def test_date_only_expiry_is_midnight_utc(self, tmp_path):
        write_stack(tmp_path, "exp-test", mutate(GOOD_EXP, "aml-hpc:expiresAt", "2027-01-15"))
        assert load_stack_config("exp-test", tmp_path).expires_at == datetime(2027, 1, 15, tzinfo=UTC)

    def test_ssh_with_key_is_on(self, tmp_path):
        write_stack(tmp_path, "dev", mutate(GOOD_ENV, "aml-hpc:clusters/0/ssh", {"publicKey": PUBKEY}))
        ssh = load_stack_config("dev", tmp_path).clusters[0].ssh
        assert ssh is not None and ssh.on


class TestCollectsEverything:
    def test_all_problems_reported_at_once(self, tmp_path):
        config = mutate(GOOD_ENV, "aml-hpc:clusters", [
            {"name": "x", "sku": "Standard_Nope", "maxNodes": 2},
            {"name": "ok-name", "sku": "Standard_NC24ads_A100_v4", "maxNodes": 3},
        ])
        config["aml-hpc:budget"] = {"monthlyAmountUsd": 10}
        write_stack(tmp_path, "dev", config)
        with pytest.raises(UserError) as info:
            load_stack_config("dev", tmp_path)
        paths = {p.path for p in info.value.problems}
        assert {"aml-hpc:clusters[0].name", "aml-hpc:clusters[0].sku", "aml-hpc:clusters[1].sku",
                "aml-hpc:budget.alertEmails"} <= paths


class TestStackFiles:
    def test_missing_stack_file_lists_known_stacks(self, tmp_path):
        write_stack(tmp_path, "dev", GOOD_ENV)
        with pytest.raises(UserError) as info:
            read_stack_file("staging", tmp_path)
        assert "Pulumi.staging.yaml" in info.value.render() and "stacks here: dev" in info.value.render()

    def test_invalid_yaml_names_the_line(self, tmp_path):
        (tmp_path / "Pulumi.dev.yaml").write_text("config:\n  aml-hpc:owner: [unclosed\n")
        with pytest.raises(UserError) as info:
            read_stack_file("dev", tmp_path)
        assert "Pulumi.dev.yaml: line" in info.value.render() and "not valid YAML" in info.value.render()

    def test_encrypted_value_where_none_is_expected(self):
        with pytest.raises(UserError) as info:
            parse("dev", {**GOOD_ENV, "aml-hpc:owner": {"secure": "v1:abc"}}, "Pulumi.dev.yaml")
        assert "aml-hpc:owner: is encrypted" in info.value.render()


def test_type_and_rule_errors_arrive_together():
    """A wrong type no longer hides the rule checks: both kinds, on other keys and on the
    other clusters, are in the one error (indices as in the file)."""
    flat = {**GOOD_ENV, "aml-hpc:clusters": [
        {"name": "gpu-a", "sku": "Standard_ND96asr_v4", "maxNodes": "lots"},
        {"name": "gpu-b", "sku": "Standard_ND96asr_v4", "maxNodes": 2, "minNodes": 1}],
        "aml-hpc:budget": {"monthlyAmountUsd": 100, "alertEmails": ["not-an-email"]},
        "aml-hpc:storage": {"softDeleteDays": "x"}}
    with pytest.raises(UserError) as info:
        parse("dev", flat, "Pulumi.dev.yaml")
    paths = [p.path for p in info.value.problems]
    assert paths == ["aml-hpc:storage.softDeleteDays", "aml-hpc:clusters[0].maxNodes",
                     "aml-hpc:clusters[1].minNodes", "aml-hpc:budget.alertEmails[0]"]


def test_a_key_with_a_type_error_is_not_also_called_missing():
    flat = {**GOOD_ENV, "aml-hpc:clusters": [{"name": "gpu", "sku": "Standard_ND96asr_v4", "maxNodes": "x"}],
            "aml-hpc:budget": "cheap"}
    with pytest.raises(UserError) as info:
        parse("exp-a", {**flat, "aml-hpc:environment": "dev", "aml-hpc:expiresAt": "2026-12-31"}, "Pulumi.exp-a.yaml")
    text = info.value.render()
    assert "aml-hpc:clusters[0].maxNodes" in text and "must declare at least one cluster" not in text
    assert "aml-hpc:budget" in text


def test_a_region_newer_than_the_list_is_accepted():
    """The region is valid; whether a size is offered there is the availability catalog's
    call, which a cluster can overrule with allowUnlistedRegion."""
    opted_in = [{"name": "nd-a100", "sku": "Standard_ND96asr_v4", "maxNodes": 4, "allowUnlistedRegion": True}]
    parsed = parse("dev", {**GOOD_ENV, "azure-native:location": "saudiarabiacentral", "aml-hpc:clusters": opted_in},
                   "Pulumi.dev.yaml")
    assert parsed.location == "saudiarabiacentral"
    with pytest.raises(UserError) as refused:
        parse("dev", {**GOOD_ENV, "azure-native:location": "saudiarabiacentral"}, "Pulumi.dev.yaml")
    assert [p.path for p in refused.value.problems] == ["azure-native:location", "aml-hpc:clusters[0].sku"]
    assert "allowUnlistedRegion" in refused.value.problems[0].hint


class TestRegionsAgainstAzuresList:
    """A location must be one of Azure's regions (amlhpc/core/regions.py) with or without clusters."""

    def test_a_misspelled_region_without_clusters_is_refused_with_the_near_match(self):
        flat = {k: v for k, v in GOOD_ENV.items() if k != "aml-hpc:clusters"}
        with pytest.raises(UserError) as refused:
            parse("dev", {**flat, "azure-native:location": "swedencentrl"}, "Pulumi.dev.yaml")
        (problem,) = refused.value.problems
        assert problem.path == "azure-native:location" and "'swedencentrl' is not one of Azure's public regions" in problem.message
        assert "did you mean swedencentral?" in problem.hint and "'azure-native:location' swedencentral" in problem.hint

    def test_a_region_opened_after_the_list_is_an_opt_in(self):
        flat = {k: v for k, v in GOOD_ENV.items() if k != "aml-hpc:clusters"}
        parsed = parse("dev", {**flat, "azure-native:location": "saudiarabiacentral", "aml-hpc:allowUnlistedRegion": True},
                       "Pulumi.dev.yaml")
        assert parsed.location == "saudiarabiacentral"


class TestContainerRegistry:
    PRIVATE = {"isolation": "private", "addressSpace": "10.40.0.0/16",
               "wayIn": {"handOff": {"via": "VPN", "addressPrefixes": ["192.168.0.0/24"]}}}

    def test_the_tier_defaults_to_the_isolations(self, tmp_path):
        write_stack(tmp_path, "dev", GOOD_ENV)
        assert load_stack_config("dev", tmp_path).container_registry_sku == "Standard"
        write_stack(tmp_path, "dev", mutate(GOOD_ENV, "aml-hpc:network", self.PRIVATE))
        assert load_stack_config("dev", tmp_path).container_registry_sku == "Premium", "private endpoints need it"

    def test_a_public_stack_can_raise_it(self, tmp_path):
        write_stack(tmp_path, "dev", mutate(GOOD_ENV, "aml-hpc:containerRegistry", {"sku": "Premium"}))
        assert load_stack_config("dev", tmp_path).container_registry_sku == "Premium"

    def test_a_private_stack_cannot_lower_it(self, tmp_path):
        config = mutate(mutate(GOOD_ENV, "aml-hpc:network", self.PRIVATE), "aml-hpc:containerRegistry", {"sku": "Standard"})
        write_stack(tmp_path, "dev", config)
        with pytest.raises(UserError) as info:
            load_stack_config("dev", tmp_path)
        message = info.value.render()
        assert "aml-hpc:containerRegistry.sku" in message and "private endpoint needs Premium" in message
        assert "pulumi config set --path 'aml-hpc:containerRegistry.sku' Premium --stack dev" in message

    def test_an_experiment_takes_the_environments(self, tmp_path):
        write_stack(tmp_path, "exp-test", mutate(GOOD_EXP, "aml-hpc:containerRegistry", {"sku": "Premium"}))
        with pytest.raises(UserError) as info:
            load_stack_config("exp-test", tmp_path)
        assert "aml-hpc:containerRegistry" in info.value.render() and "belongs to the environment stack" in info.value.render()
