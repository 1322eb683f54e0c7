"""Storage accounts by role: a stack's checkpoint accounts (striped, soft delete off, old
versions deleted) and its coordination account, declared by the Pulumi program (planned here
with Pulumi's mock runtime), granted by the permission model, exported as `checkpointAccounts`
and `coordinationAccount`, and loaded account by account in the plan."""

from __future__ import annotations

import math
from pathlib import Path
from unittest.mock import MagicMock

import pulumi
import pytest

from amlhpc.core.errors import UserError
from amlhpc.core.outputs import StackOutputs
from amlhpc.core.permissions import MODEL
from amlhpc.core.storage_load import (
    CHECKPOINT_INGRESS_SHARE,
    COORDINATION_REQUESTS_PER_NODE_S,
    ClusterDemand,
    account_load,
    checkpoint_accounts_needed,
)
from amlhpc.infra import naming
from amlhpc.infra.config import parse
from amlhpc.infra.plan import evaluate
from amlhpc.infra.plan.access import access_view
from amlhpc.infra.policy.plan_check import check_plan
from tests.conformance.conformance_stacks import NOW
from tests.plan_helpers import write_stack

ACCOUNT = "azure-native:storage:StorageAccount"
BLOB_SERVICE = "azure-native:storage:BlobServiceProperties"
LIFECYCLE = "azure-native:storage:ManagementPolicy"
CONTAINER = "azure-native:storage:BlobContainer"
ROLE = "azure-native:authorization:RoleAssignment"

ENV = {
    "azure-native:location": "swedencentral",
    "aml-hpc:owner": "ml-platform@example.com",
    "aml-hpc:nameSuffix": "r0les1",
    "aml-hpc:clusters": [{"name": "nd-h100", "sku": "Standard_ND96isr_H100_v5", "maxNodes": 64}],
    "aml-hpc:submitters": [{"principalId": "11111111-2222-3333-4444-555555555555", "principalType": "Group"}],
    "aml-hpc:budget": {"monthlyAmountUsd": 500000, "alertEmails": ["ml-platform@example.com"]},
}
BY_ROLE = {**ENV, "aml-hpc:checkpointAccounts": {"count": 2}, "aml-hpc:storage": {"coordinationAccount": True}}
PRIVATE = {"isolation": "private", "addressSpace": "10.40.0.0/16",
           "wayIn": {"handOff": {"via": "VPN", "addressPrefixes": ["10.0.0.0/12"]}}}
EXPERIMENT = {
    "azure-native:location": "swedencentral",
    "aml-hpc:owner": "researcher@example.com",
    "aml-hpc:environment": "dev",
    "aml-hpc:expiresAt": "2026-12-31",
    "aml-hpc:clusters": [{"name": "big-h100", "sku": "Standard_ND96isr_H100_v5", "maxNodes": 100}],
    "aml-hpc:checkpointAccounts": {"modelParams": 405e9, "intervalS": 600},
}


def plan_of(tmp_path: Path, config: dict, stack: str = "dev"):
    write_stack(tmp_path, stack, config)
    return evaluate(stack, tmp_path, now=NOW)


class TestHowMany:
    def test_a_405b_checkpoint_needs_five_accounts_in_600_s(self):
        # 405e9 x 16 bytes = 6.48 TB; one account takes 0.9 x 600 s x 0.9 x 25 Gb/s = 1.51875 TB.
        assert checkpoint_accounts_needed(405e9 * 16, 600, 25.0) == 5
        assert checkpoint_accounts_needed(1e9, 600, 25.0) == 1
        cfg = parse("exp-big", EXPERIMENT, "Pulumi.exp-big.yaml")
        assert cfg.checkpoint_accounts is not None and cfg.checkpoint_accounts.accounts() == 5
        assert len(cfg.names.checkpoint_storage) == 5

    def test_a_given_count_wins_and_a_size_in_gb_works_too(self):
        cfg = parse("dev", {**ENV, "aml-hpc:checkpointAccounts": {"count": 3}}, "Pulumi.dev.yaml")
        assert len(cfg.names.checkpoint_storage) == 3
        by_gb = parse("dev", {**ENV, "aml-hpc:checkpointAccounts": {"checkpointGb": 3400, "intervalS": 600}}, "x")
        assert len(by_gb.names.checkpoint_storage) == math.ceil(3400e9 / (600 * CHECKPOINT_INGRESS_SHARE * 25e9 / 8))

    def test_no_key_means_no_account_of_their_own(self):
        cfg = parse("dev", ENV, "Pulumi.dev.yaml")
        assert cfg.checkpoint_accounts is None and cfg.names.checkpoint_storage == ()
        assert not cfg.storage.coordination_account

    @pytest.mark.parametrize("given, path, words", [
        ({"count": 2, "modelParams": 405e9}, "aml-hpc:checkpointAccounts.count", "set count to 5 or more"),
        ({"modelParams": 7e9, "checkpointGb": 100}, "aml-hpc:checkpointAccounts.checkpointGb", "keep one of"),
        ({"modelParams": 4e12, "intervalS": 60}, "aml-hpc:checkpointAccounts", "raise intervalS"),
        ({"softDeleteDays": 7}, "aml-hpc:checkpointAccounts.softDeleteDays", ""),
        ({"count": 17}, "aml-hpc:checkpointAccounts.count", ""),
    ])
    def test_bad_values_name_the_key_and_the_fix(self, given, path, words):
        with pytest.raises(UserError) as raised:
            parse("dev", {**ENV, "aml-hpc:checkpointAccounts": given}, "Pulumi.dev.yaml")
        problem = next(p for p in raised.value.problems if p.path == path)
        assert words in problem.hint

    def test_the_names_are_azures_and_distinct(self):
        for stack in ("dev", "a-very-long-environment-name", "exp-sweep-1", "exp-sweep-2"):
            names = naming.StackNames.derive("amlhpcprefix", stack, "eastus", suffix=None, checkpoint_accounts=16)
            every = [names.dataset_storage, names.workspace_storage, names.coordination_storage, *names.checkpoint_storage]
            assert len(set(every)) == len(every) and names.problems() == [], stack
            assert all(len(n) <= 24 for n in every)
        one = naming.StackNames.derive("amlhpc", "exp-sweep-1", "eastus", checkpoint_accounts=1)
        two = naming.StackNames.derive("amlhpc", "exp-sweep-2", "eastus", checkpoint_accounts=1)
        assert one.checkpoint_storage != two.checkpoint_storage  # same stem, different stacks


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return plan_of(tmp_path_factory.mktemp("byrole"), BY_ROLE)


class TestEnvironmentByRole:
    def test_three_roles_three_kinds_of_account(self, plan):
        names = plan.config.names
        accounts = {r.inputs["accountName"]: r for r in plan.of_type(ACCOUNT)}
        assert {names.dataset_storage, names.coordination_storage, *names.checkpoint_storage} <= set(accounts)
        for name in (*names.checkpoint_storage, names.coordination_storage):
            assert accounts[name].retain_on_delete  # kept on teardown like the dataset account
            assert accounts[name].inputs["allowBlobPublicAccess"] is False

    def test_checkpoint_accounts_keep_no_soft_deleted_copies_and_drop_old_versions(self, plan):
        services = {r.name: r for r in plan.of_type(BLOB_SERVICE)}
        for i in (1, 2):
            service = services[f"checkpoints{i}-blob-service"]
            assert service.inputs["deleteRetentionPolicy"] == {"enabled": False}
        assert services["coordination-blob-service"].inputs["deleteRetentionPolicy"]["enabled"] is True
        assert services["data-blob-service"].inputs["deleteRetentionPolicy"]["days"] == 14  # datasets: as before
        rules = {r.name: r for r in plan.of_type(LIFECYCLE)}
        assert set(rules) == {"checkpoints1-lifecycle", "checkpoints2-lifecycle"}
        (rule,) = rules["checkpoints1-lifecycle"].inputs["policy"]["rules"]
        actions = rule["definition"]["actions"]
        assert actions["version"]["delete"]["daysAfterCreationGreaterThan"] == 1
        assert actions["snapshot"]["delete"]["daysAfterCreationGreaterThan"] == 1

    def test_each_account_holds_its_roles_containers(self, plan):
        names = plan.config.names
        where = {(r.inputs["accountName"], r.inputs["containerName"]) for r in plan.of_type(CONTAINER)}
        assert {(n, "checkpoints") for n in names.checkpoint_storage} <= where
        assert (names.coordination_storage, "supervision") in where
        assert (names.dataset_storage, "checkpoints") in where  # a stack deployed before keeps its runs' checkpoints

    def test_outputs_name_the_accounts_in_striping_order(self, plan):
        names = plan.config.names
        doc = StackOutputs.model_validate(plan.outputs)
        assert doc.checkpoint_accounts == list(names.checkpoint_storage)
        assert doc.coordination_account == names.coordination_storage

    def test_every_identity_holds_on_every_account_what_the_model_gives_it(self, plan):
        view = access_view(plan)
        assert view["unexplained"] == []
        declared = {r.name for r in plan.of_type(ROLE)}
        # the dataset account's container (a stack deployed before keeps its runs there), then each account's
        for name, key, count in (("access", "checkpoints-write", 3), ("controller-access", "checkpoints-read", 3),
                                 ("controller-access", "supervision-write", 2), ("access", "submitter-0-supervision", 2)):
            assert {f"{name}-{key}", *(f"{name}-acct{n}-{key}" for n in range(1, count))} <= declared, key
            assert f"{name}-acct{count}-{key}" not in declared
        assert MODEL.right("compute", "checkpoints-write").scope == "container:checkpoints"

    def test_the_plan_loads_each_account_against_azures_targets(self, plan):
        names = plan.config.names
        loads = {a.account: a for a in plan.storage_load()}
        assert loads[names.dataset_storage].roles == ("datasets",)
        assert loads[names.coordination_storage].roles == ("coordination",)
        for name in names.checkpoint_storage:
            load = loads[name]
            assert load.roles == ("checkpoints",)
            # one job of 64 nodes, striped over two accounts: 90 % of each account's ingress
            assert load.ingress_gbps == pytest.approx(25.0 * CHECKPOINT_INGRESS_SHARE)
            assert load.over() == []
        assert loads[names.coordination_storage].requests_per_s == pytest.approx(64 * COORDINATION_REQUESTS_PER_NODE_S)
        doc = plan.to_json()["storageLoad"]
        assert [a["account"] for a in doc] == [names.dataset_storage, *names.checkpoint_storage, names.coordination_storage]

    def test_a_closed_network_reaches_every_account_through_an_endpoint(self, tmp_path):
        private = {**BY_ROLE, "aml-hpc:network": PRIVATE}
        plan = plan_of(tmp_path, private)
        endpoints = {r.name for r in plan.of_type("azure-native:network:PrivateEndpoint")}
        assert {"endpoints-checkpoints1-blob", "endpoints-checkpoints2-blob", "endpoints-coordination-blob"} <= endpoints
        accounts = {r.inputs["accountName"]: r for r in plan.of_type(ACCOUNT)}
        assert accounts[plan.config.names.coordination_storage].inputs["publicNetworkAccess"] == "Disabled"


class TestDefaults:
    def test_a_stack_without_the_keys_keeps_one_account_for_every_role(self, tmp_path):
        plan = plan_of(tmp_path, ENV)
        doc = StackOutputs.model_validate(plan.outputs)
        dataset = plan.config.names.dataset_storage
        assert doc.checkpoint_accounts == [dataset] and doc.coordination_account == dataset
        assert {r.inputs["accountName"] for r in plan.of_type(ACCOUNT)} == {dataset, plan.config.names.workspace_storage}
        (load,) = plan.storage_load()
        assert load.roles == ("datasets", "checkpoints", "coordination")

    def test_outputs_of_a_stack_deployed_before_still_load(self, tmp_path):
        plan = plan_of(tmp_path, ENV)
        old = {k: v for k, v in plan.outputs.items() if k not in ("checkpointAccounts", "coordinationAccount")}
        doc = StackOutputs.model_validate(old)
        assert doc.checkpoint_accounts is None and doc.coordination_account is None


class TestExperimentAccounts:
    def test_an_experiment_gets_its_own_checkpoint_accounts(self, tmp_path):
        write_stack(tmp_path, "dev", ENV)
        plan = plan_of(tmp_path, EXPERIMENT, "exp-big")
        names = plan.config.names.checkpoint_storage
        assert len(names) == 5
        accounts = {r.inputs["accountName"]: r for r in plan.of_type(ACCOUNT)}
        assert set(names) == set(accounts)
        # teardown keeps them (a run's checkpoints outlive the experiment); not protected: deleting them is a choice
        assert all(a.retain_on_delete and not a.protect for a in accounts.values())
        assert plan.outputs["checkpointAccounts"] == list(names)
        assert plan.outputs["coordinationAccount"] == plan.environment.config.names.dataset_storage
        grants = plan.of_type(ROLE)
        writes = [g for g in grants if g.name.startswith("checkpoint-access-")]
        assert len(writes) == 5 and all(g.name.endswith("-checkpoints-write") for g in writes)
        identity = plan.environment.outputs["identity"]["principalId"]
        assert {g.inputs["principalId"] for g in writes} == {identity}
        # the environment's controller reads its runs' records there, the submitters the pointer (jobs status)
        reads = {g.name: g.inputs["principalId"] for g in grants if g.name.startswith("checkpoint-readers-")}
        controller = plan.environment.outputs["controller"]["identity"]["principalId"]
        submitter = ENV["aml-hpc:submitters"][0]["principalId"]
        assert sorted(reads) == sorted([f"checkpoint-readers-{p}checkpoints-read" for p in ("", "acct1-", "acct2-", "acct3-", "acct4-")]
                                       + [f"checkpoint-readers-{p}submitter-0-checkpoints-read"
                                          for p in ("", "acct1-", "acct2-", "acct3-", "acct4-")])
        assert {v for k, v in reads.items() if "submitter" in k} == {submitter}
        assert {v for k, v in reads.items() if "submitter" not in k} == {controller}
        assert len(grants) == 15, "nothing else"
        loads = [a for a in plan.storage_load() if a.roles == ("checkpoints",)]
        assert len(loads) == 5 and all(a.over() == [] for a in loads)

    def test_an_experiment_without_the_key_inherits_the_environments(self, tmp_path):
        write_stack(tmp_path, "dev", BY_ROLE)
        plan = plan_of(tmp_path, {k: v for k, v in EXPERIMENT.items() if k != "aml-hpc:checkpointAccounts"}, "exp-big")
        env = plan.environment.config.names
        assert plan.outputs["checkpointAccounts"] == list(env.checkpoint_storage)
        assert plan.outputs["coordinationAccount"] == env.coordination_storage
        assert plan.of_type(ACCOUNT) == []

    def test_an_experiment_in_a_closed_environment_is_refused(self, tmp_path):
        write_stack(tmp_path, "dev", {**ENV, "aml-hpc:network": PRIVATE})
        with pytest.raises(Exception) as raised:
            plan_of(tmp_path, EXPERIMENT, "exp-big")
        assert "aml-hpc:checkpointAccounts" in str(raised.value) and "Pulumi.dev.yaml" in str(raised.value)
        assert isinstance(raised.value, (pulumi.RunError, UserError, RuntimeError))


class TestPolicy:
    def test_the_environment_by_role_passes_the_policy(self, plan):
        assert [v.rule for v in check_plan(plan) if v.level == "mandatory"] == []

    def test_an_experiments_kept_checkpoint_accounts_pass_and_a_deleted_one_does_not(self, tmp_path):
        write_stack(tmp_path, "dev", ENV)
        experiment = plan_of(tmp_path, EXPERIMENT, "exp-big")
        assert [v.rule for v in check_plan(experiment) if v.rule == "experiment-clusters-only"] == []
        doc = experiment.to_json()
        account = next(r for r in doc["resources"] if r["type"] == ACCOUNT)
        account["options"]["retainOnDelete"] = False  # teardown would delete the run's checkpoints
        assert [v.rule for v in check_plan(doc)].count("experiment-clusters-only") == 1

    def test_a_checkpoint_account_keeping_deleted_blobs_for_days_is_refused(self, plan):
        doc = plan.to_json()
        service = next(r for r in doc["resources"] if r["name"] == "checkpoints1-blob-service")
        service["inputs"]["deleteRetentionPolicy"] = {"enabled": True, "days": 14}
        (found,) = [v for v in check_plan(doc) if v.rule == "checkpoint-soft-delete"]
        assert "14 days" in found.message and "softDeleteDays" in found.fix


class TestStriping:
    def test_each_account_takes_an_equal_share_of_a_striped_job(self):
        one = account_load("a", ("checkpoints",), [ClusterDemand("c", 100, 200.0)], 25.0, 50.0, stripes=1)
        four = account_load("a", ("checkpoints",), [ClusterDemand("c", 100, 200.0)], 25.0, 50.0, stripes=4)
        assert one.ingress_gbps == pytest.approx(four.ingress_gbps) == pytest.approx(22.5)

    def test_a_small_job_cannot_fill_many_accounts(self):
        # 2 nodes x 8 Gb/s NICs: 16 Gb/s at most, spread over 4 accounts
        load = account_load("a", ("checkpoints",), [ClusterDemand("c", 2, 8.0)], 25.0, 50.0, stripes=4)
        assert load.ingress_gbps == pytest.approx(4.0)


class TestSubmit:
    def test_a_405b_checkpoint_on_one_account_is_refused_with_the_split(self):
        from amlhpc.jobs.plan import limits

        problem = limits.checkpoint_fit_problem("j", 405_000_000_000, 600, 1, 25.0, "exp-big")
        assert problem is not None and problem.path == "checkpoint.interval_s"
        assert "6.48 TB" in problem.message and "2,304 s" in problem.message  # 6.48e12 x 8 / 22.5e9
        assert "aml-hpc:checkpointAccounts: {count: 5} in Pulumi.exp-big.yaml" in problem.hint
        assert "--set checkpoint.interval_s=2560" in problem.hint  # 2,304 s of bytes in 90 % of it
        assert limits.checkpoint_fit_problem("j", 405_000_000_000, 600, 4, 25.0, "exp-big") is not None, \
            "4 accounts take 576 s of bytes: with the nodes' phases and the commit, 605 s in the simulation"
        assert limits.checkpoint_fit_problem("j", 405_000_000_000, 600, 5, 25.0, "exp-big") is None

    def test_the_jobs_settings_give_the_interval_and_the_ingress(self):
        import json

        from amlhpc.jobs.plan import limits
        from amlhpc.jobs.runtime.base import contract

        env = {contract.CHECKPOINT_JSON: json.dumps({"interval_s": 600, "ingress_gbps": 25.0})}
        assert limits.job_checkpoint_fit("j", 70_000_000_000, env, 1, "dev") is None  # 1.12 TB fits one account
        assert limits.job_checkpoint_fit("j", 405_000_000_000, env, 1, "dev") is not None
        assert limits.job_checkpoint_fit("j", 405_000_000_000, {}, 1, "dev") is None  # checkpoints off

    def test_submit_refuses_before_anything_is_created(self):
        import json
        from types import SimpleNamespace

        from amlhpc.jobs.cli import main
        from amlhpc.jobs.runtime.base import contract

        env = {contract.CHECKPOINT_JSON: json.dumps({"account_url": "https://a.blob.core.windows.net", "cap_mbps": 100,
                                                     "interval_s": 600, "ingress_gbps": 25.0})}
        plan = SimpleNamespace(name="big", instance_count=100, environment_variables=env,
                               deepspeed=SimpleNamespace(params=405_000_000_000))
        outputs = SimpleNamespace(stack="dev", workspace="ws", checkpoint_accounts=None,
                                  storage=SimpleNamespace(ingress_gbps=25.0, account="a"))
        idle = SimpleNamespace(active_checkpoint_caps=lambda client, url, ws: [])
        with pytest.raises(UserError) as raised:
            main._check_checkpoint_budget(idle, None, outputs, plan)  # noqa: SLF001
        assert "does not fit its interval" in raised.value.title
        striped = SimpleNamespace(**{**vars(outputs), "checkpoint_accounts": ["c1", "c2", "c3", "c4", "c5"]})
        main._check_checkpoint_budget(idle, None, striped, plan)  # noqa: SLF001

    def test_the_budget_refusal_says_how_many_accounts_of_its_own_would_hold_the_job(self):
        from amlhpc.jobs.plan import limits

        problem = limits.checkpoint_budget_problem("j", 100, 45.0, [("a", 12.0)], 25.0, "acct")
        # accounts of its own carry this job alone: 45 Gb/s over 22.5 Gb/s (90 % of 25) each
        assert problem is not None and "aml-hpc:checkpointAccounts: {count: 2}" in problem.hint


class TestConsumers:
    def doc(self, **changes):
        from tests.jobs_helpers import outputs_doc

        return StackOutputs.model_validate({**outputs_doc("dev"), **changes})

    def test_the_coordination_endpoint_follows_its_account(self):
        by_role = self.doc(checkpointAccounts=["devck1x", "devck2x"], coordinationAccount="devcox")
        assert by_role.coordination_endpoint() == "https://devcox.blob.core.windows.net/"
        for before in (self.doc(checkpointAccounts=None, coordinationAccount=None), self.doc()):
            assert before.coordination_endpoint() == before.storage.blob_endpoint

    def test_the_records_of_managed_runs_go_to_the_coordination_account(self, monkeypatch):
        import azure.ai.ml

        from amlhpc.jobs.managed import client, settings
        from amlhpc.jobs.runtime.blob import blobio

        opened = []
        def opening(name, url, env=None):
            opened.append((name, url))
            return MagicMock()

        monkeypatch.setattr(blobio, "container_client_from_env", opening)
        monkeypatch.setattr(blobio, "container_client", lambda name, account_url: opening(name, account_url))
        monkeypatch.setattr(blobio, "credential_from_env", lambda env: None)
        monkeypatch.setattr(azure.ai.ml, "MLClient", lambda *a: None)
        policy = {"max_restarts": 1}
        base = {"workspace": {"subscription_id": "s", "resource_group": "g", "name": "w"}, "secret": "0" * 64,
                "storage": {"account_url": "https://ck/", "container": "checkpoints", "prefix": "r/1",
                            "supervision": "supervision", "supervision_account_url": "https://co/"}}
        try:
            settings.connect({**base, "policy": policy})
        except Exception:  # noqa: BLE001 - only the containers it opened matter here
            pass
        assert ("checkpoints", "https://ck/") in opened and ("supervision", "https://co/") in opened
        opened.clear()
        older = {**base, "storage": {k: v for k, v in base["storage"].items() if k != "supervision_account_url"}}
        try:
            settings.connect({**older, "policy": policy})
        except Exception:  # noqa: BLE001
            pass
        assert ("supervision", "https://ck/") in opened  # settings written before: one account
        opened.clear()
        client.store_for(self.doc(coordinationAccount="devcox"), client.RecordPlace("supervision", "r/1"))
        assert opened == [("supervision", "https://devcox.blob.core.windows.net/")]
