"""Abuse cases: each lower principal tries to cross a boundary and is refused, with the reason.

The emulated cloud holds what the real programs create: the access program's CI identities,
federated credentials, custom roles and role assignments; dev, prod and a dev experiment
deployed by the environment program; their role assignments. `Authorizer`
(tests/lifecycle/lifecycle_rbac.py) decides as Azure RBAC does; tests/github_gate.py gives a
workflow job what GitHub would. Every refusal is checked next to what the same principal may
do, so a test cannot pass because nothing is allowed at all.
"""

from __future__ import annotations

import shlex
import subprocess

import pytest
import yaml

from amlhpc.infra.access.config import parse as access_config
from amlhpc.infra.access.github import commands as github_commands
from amlhpc.infra.access.program import build as access_build
from amlhpc.infra.config import REPO_ROOT
from amlhpc.infra.lifecycle import new_experiment
from tests.github_gate import JobAccess, job_access, stored_secrets
from tests.lifecycle.lifecycle_cloud import FakeAzure
from tests.lifecycle.lifecycle_rbac import Authorizer
from tests.lifecycle.lifecycle_tooling import Adopter, clone

SUB = "aaaaaaaa-0000-0000-0000-000000000001"
REPOSITORY = "my-org/aml-hpc"
SUBMITTERS = "11111111-2222-3333-4444-555555555555"
ML = "Microsoft.MachineLearningServices/workspaces"
BLOB_WRITE = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write"
BLOB_READ = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read"
BLOB_DELETE = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/delete"
BLOB_ACTIONS = (BLOB_READ, BLOB_WRITE, BLOB_DELETE)
ROLE_WRITE = "Microsoft.Authorization/roleAssignments/write"
OWNER = "8e3af657-a8ff-443c-a75c-2fe8c4bcb635"
CONTRIBUTOR = "b24988ac-6180-42a0-ab88-20f7382dd24c"
EXPERIMENT_STATE = ".pulumi/stacks/aml-hpc/exp-sweep-7.json"


class Cloud:
    """One subscription with the access program, dev (with a submitter group), prod and a dev experiment."""

    def __init__(self, root):
        self.azure = FakeAzure()
        self.adopter = Adopter(self.azure, clone(root), SUB)
        path = self.adopter.root / "Pulumi.dev.yaml"
        dev = yaml.safe_load(path.read_text())
        dev["config"]["aml-hpc:submitters"] = [{"principalId": SUBMITTERS, "principalType": "Group"}]
        path.write_text(yaml.safe_dump(dev, sort_keys=False))
        config = access_config({"aml-hpc-access:repository": REPOSITORY, "aml-hpc-access:stateAccount": "amlhpcstate1",
                                "azure-native:location": "swedencentral"}, "test", root=self.adopter.root)
        self.access = self.adopter.engine.up("access", lambda: access_build(config))
        self.dev = self.adopter.make_up("dev")
        self.prod = self.adopter.make_up("prod")
        self.experiment = new_experiment("sweep", "dev", 7, self.adopter.root, now=self.azure.now).name[7:-5]
        self.exp = self.adopter.make_up(self.experiment)
        self.rbac = Authorizer(self.azure)

    def ci(self, environment: str, principal: str) -> str:
        """The principal id Azure gave a CI identity (read from the access stack's state)."""
        name = f"id-amlhpc-{environment}-{principal}"
        (found,) = [r for r in self.adopter.state("access").values() if r.inputs.get("resourceName") == name
                    and r.type == "azure-native:managedidentity:UserAssignedIdentity"]
        return found.outputs["principalId"]

    def group(self, outputs: dict) -> str:
        return f"/subscriptions/{SUB}/resourceGroups/{outputs['resourceGroup']}"

    def workspace(self, outputs: dict) -> str:
        return outputs["workspaceId"]

    def container(self, outputs: dict, name: str) -> str:
        account = outputs["storage"]["account"]
        return (f"{self.group(outputs)}/providers/Microsoft.Storage/storageAccounts/{account}"
                f"/blobServices/default/containers/{name}")

    def state(self, environment: str) -> str:
        """The environment stack's state container."""
        return (f"/subscriptions/{SUB}/resourceGroups/rg-amlhpc-access/providers/Microsoft.Storage/storageAccounts/"
                f"amlhpcstate1/blobServices/default/containers/state-{environment}")

    def experiments_state(self, environment: str) -> str:
        """Its experiments' state container."""
        return f"{self.state(environment)}-experiments"

    def ci_identities(self) -> list[str]:
        return [self.ci(e, p) for e in ("dev", "prod") for p in ("deploy", "teardown")]


@pytest.fixture(scope="module")
def cloud(tmp_path_factory) -> Cloud:
    return Cloud(tmp_path_factory.mktemp("trust"))


def refused(decision, *fragments: str) -> None:
    assert not decision.allowed, decision.reason
    for fragment in fragments:
        assert fragment in decision.reason, decision.reason


class TestPullRequest:
    """A pull request runs its own code and its own workflow file: it must get nothing that
    writes state or reads a passphrase."""

    def test_the_shipped_pr_jobs_get_no_token_and_no_secret(self):
        doc = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "pr.yml").read_text())
        for name, job in doc["jobs"].items():
            access = job_access(job, repository=REPOSITORY, event="pull_request", ref="refs/pull/7/merge",
                                environments=["dev", "prod"])
            assert access.subject is None and access.secrets == (), name

    def test_a_pr_that_asks_for_prod_is_refused_by_the_environments_branch_rule(self):
        job = {"environment": "prod", "permissions": {"id-token": "write"}}
        access = job_access(job, repository=REPOSITORY, event="pull_request", ref="refs/pull/7/merge",
                            environments=["dev", "prod"])
        assert access.refused == "environment 'prod' admits deployments from main only, and this run is on refs/pull/7/merge"
        assert access.subject is None and "PULUMI_CONFIG_PASSPHRASE" not in access.secrets
        on_main = job_access(job, repository=REPOSITORY, event="push", ref="refs/heads/main", environments=["dev", "prod"])
        assert on_main.subject == f"repo:{REPOSITORY}:environment:prod" and "PULUMI_CONFIG_PASSPHRASE" in on_main.secrets

    @pytest.mark.parametrize("environment", [None, "pr-sandbox"])
    def test_a_pr_token_matches_no_identity_so_it_cannot_write_state(self, cloud, environment):
        """A PR job that mints its own token gets a subject no federated credential accepts."""
        job = {"permissions": {"id-token": "write"}, **({"environment": environment} if environment else {})}
        access = job_access(job, repository=REPOSITORY, event="pull_request", ref="refs/pull/7/merge",
                            environments=["dev", "prod"])
        subjects = {o.body["subject"] for o in cloud.azure.of_type("azure-native:managedidentity:FederatedIdentityCredential")}
        assert access.subject not in subjects and access.secrets == ()
        assert subjects == {f"repo:{REPOSITORY}:environment:{e}" for e in ("dev", "prod", "teardown-dev", "teardown-prod")}

    def test_state_is_written_only_by_its_environments_identities(self, cloud):
        """An environment's state: its deploy identity only. Its experiments' state: its deploy
        and teardown identities. No CI identity of one environment reaches another's."""
        for environment in ("dev", "prod"):
            for container, blob, expected in (
                    (cloud.state(environment), f".pulumi/stacks/aml-hpc/{environment}.json", ["deploy"]),
                    (cloud.state(environment), EXPERIMENT_STATE, ["deploy"]),
                    (cloud.experiments_state(environment), EXPERIMENT_STATE, ["deploy", "teardown"])):
                writers = [pid for pid in cloud.ci_identities()
                           if cloud.rbac.check(pid, BLOB_WRITE, f"{container}/{blob}", data=True).allowed]
                assert writers == [cloud.ci(environment, p) for p in expected], (container, blob)


class TestDevIdentity:
    def test_dev_deploys_dev(self, cloud):
        dev = cloud.ci("dev", "deploy")
        assert cloud.rbac.check(dev, f"{ML}/computes/write", f"{cloud.workspace(cloud.dev)}/computes/x").allowed
        assert cloud.rbac.check(dev, BLOB_WRITE, f"{cloud.state('dev')}/.pulumi/stacks/aml-hpc/dev.json", data=True).allowed

    def test_dev_cannot_touch_prods_resources(self, cloud):
        dev = cloud.ci("dev", "deploy")
        refused(cloud.rbac.check(dev, f"{ML}/computes/write", f"{cloud.workspace(cloud.prod)}/computes/nd-h100"),
                "Contributor at", "/resourceGroups/rg-amlhpc-dev does not cover", "rg-amlhpc-prod")
        refused(cloud.rbac.check(dev, "Microsoft.Storage/storageAccounts/delete",
                                 cloud.container(cloud.prod, "datasets").split("/blobServices")[0]), "does not cover")

    @pytest.mark.parametrize("principal", ["deploy", "teardown"])
    @pytest.mark.parametrize("action", BLOB_ACTIONS)
    def test_dev_cannot_touch_either_of_prods_state_containers(self, cloud, principal, action):
        dev = cloud.ci("dev", principal)
        for blob in (f"{cloud.state('prod')}/.pulumi/stacks/aml-hpc/prod.json",
                     f"{cloud.experiments_state('prod')}/{EXPERIMENT_STATE}"):
            refused(cloud.rbac.check(dev, action, blob, data=True), "state-dev-experiments does not cover")
        # ...while it does reach its own environment's experiments (the refusal is about prod)
        assert cloud.rbac.check(dev, action, f"{cloud.experiments_state('dev')}/{EXPERIMENT_STATE}", data=True).allowed

    def test_dev_cannot_make_itself_owner(self, cloud):
        """Its RBAC Administrator assigns only the program's roles: Owner and Contributor are refused."""
        dev = cloud.ci("dev", "deploy")
        for role in (OWNER, CONTRIBUTOR):
            refused(cloud.rbac.check(dev, ROLE_WRITE, cloud.group(cloud.dev), requested_role=role),
                    "its condition does not allow Microsoft.Authorization/roleAssignments/write for the role")
        reader = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
        assert cloud.rbac.check(dev, ROLE_WRITE, cloud.group(cloud.dev), requested_role=reader, principal_type="User").allowed

    @pytest.mark.parametrize("role, principal_type, allowed", [
        ("7f951dda-4ed3-4680-a7ca-43fe172d538d", "ServicePrincipal", True),   # AcrPull to an identity
        ("7f951dda-4ed3-4680-a7ca-43fe172d538d", "User", False),              # ...to a person: no right says so
        ("b78c5d69-af96-48a3-bf8d-a8b4d589de94", "Group", False),             # Azure AI Administrator to a group
        ("ba92f5b4-2d11-453d-a403-e96b0029c9fe", "ForeignGroup", False),      # data to another tenant's group
        ("ba92f5b4-2d11-453d-a403-e96b0029c9fe", "Group", True),              # a submitter group's data role
    ])
    def test_dev_assigns_each_role_only_to_the_principal_types_the_model_gives_it(self, cloud, role, principal_type,
                                                                                    allowed):
        decision = cloud.rbac.check(cloud.ci("dev", "deploy"), ROLE_WRITE, cloud.group(cloud.dev), requested_role=role,
                                    principal_type=principal_type)
        assert decision.allowed == allowed, decision.reason


class TestTeardown:
    def test_teardown_deletes_what_an_experiment_owns(self, cloud):
        teardown = cloud.ci("dev", "teardown")
        cluster = f"{cloud.workspace(cloud.dev)}/computes/{next(iter(cloud.exp['clusters']))}"
        assert cloud.rbac.check(teardown, f"{ML}/computes/delete", cluster).allowed
        budget = f"{cloud.group(cloud.dev)}/providers/Microsoft.Consumption/budgets/budget-x"
        assert cloud.rbac.check(teardown, "Microsoft.Consumption/budgets/delete", budget).allowed

    @pytest.mark.parametrize("action, what", [
        ("Microsoft.Storage/storageAccounts/delete", "dataset-account"),
        ("Microsoft.MachineLearningServices/workspaces/delete", "workspace"),
        ("Microsoft.Resources/subscriptions/resourceGroups/delete", "group"),
        ("Microsoft.KeyVault/vaults/delete", "vault"),
        ("Microsoft.Storage/storageAccounts/blobServices/containers/delete", "container"),
    ])
    def test_teardown_cannot_delete_an_environment_resource(self, cloud, action, what):
        teardown = cloud.ci("dev", "teardown")
        scope = {"dataset-account": cloud.container(cloud.dev, "datasets").split("/blobServices")[0],
                 "workspace": cloud.workspace(cloud.dev), "group": cloud.group(cloud.dev),
                 "vault": f"{cloud.group(cloud.dev)}/providers/Microsoft.KeyVault/vaults/kv",
                 "container": cloud.container(cloud.dev, "checkpoints")}[what]
        refused(cloud.rbac.check(teardown, action, scope), f"does not allow {action}")

    @pytest.mark.parametrize("blob", [".pulumi/stacks/aml-hpc/prod.json", ".pulumi/stacks/aml-hpc/prod.json.bak",
                                      ".pulumi/history/aml-hpc/prod/prod-1.history.json",
                                      ".pulumi/locks/aml-hpc/prod/forged.json", ".pulumi/meta.yaml",
                                      "published/outputs.json", EXPERIMENT_STATE])
    @pytest.mark.parametrize("action", BLOB_ACTIONS)
    def test_prods_teardown_cannot_touch_prods_environment_state(self, cloud, blob, action):
        """teardown-prod has no reviewers: were it to write the prod stack's state, the next
        reviewed `up` would act on what it wrote; were it to read it, it would hold prod's
        outputs and encrypted config. It holds nothing on state-prod, not even on a blob named
        like an experiment's: experiments live in state-prod-experiments."""
        refused(cloud.rbac.check(cloud.ci("prod", "teardown"), action, f"{cloud.state('prod')}/{blob}", data=True),
                f"Storage Blob Data Contributor at {cloud.experiments_state('prod')} does not cover "
                f"{cloud.state('prod')}/{blob}")

    def test_prods_teardown_cannot_delete_prods_state_container(self, cloud):
        action = "Microsoft.Storage/storageAccounts/blobServices/containers/delete"
        refused(cloud.rbac.check(cloud.ci("prod", "teardown"), action, cloud.state("prod")), "does not cover")
        assert cloud.rbac.check(cloud.ci("prod", "deploy"), action, cloud.state("prod")).allowed

    @pytest.mark.parametrize("blob", [EXPERIMENT_STATE, ".pulumi/locks/aml-hpc/exp-sweep-7/lock.json",
                                      ".pulumi/history/aml-hpc/exp-sweep-7/h.json", ".pulumi/meta.yaml"])
    @pytest.mark.parametrize("action", BLOB_ACTIONS)
    def test_prods_teardown_still_destroys_experiments(self, cloud, blob, action):
        """Its job, in the experiments' own container: no condition, nothing else lives there."""
        assert cloud.rbac.check(cloud.ci("prod", "teardown"), action, f"{cloud.experiments_state('prod')}/{blob}",
                                data=True).allowed

    @pytest.mark.parametrize("container", ["state", "experiments_state"])
    @pytest.mark.parametrize("action", BLOB_ACTIONS)
    def test_prods_deploy_reaches_both_containers(self, cloud, container, action):
        """It deploys the environment (and publishes its outputs beside its state) and its experiments."""
        for blob in (".pulumi/stacks/aml-hpc/prod.json", "published/outputs.json", EXPERIMENT_STATE):
            target = f"{getattr(cloud, container)('prod')}/{blob}"
            assert cloud.rbac.check(cloud.ci("prod", "deploy"), action, target, data=True).allowed, target

    def test_dev_teardown_cannot_reach_prod(self, cloud):
        refused(cloud.rbac.check(cloud.ci("dev", "teardown"), f"{ML}/computes/delete",
                                 f"{cloud.workspace(cloud.prod)}/computes/nd-h100"), "does not cover")


@pytest.fixture(scope="module")
def passphrases(cloud, tmp_path_factory):
    """The access setup's gh commands for the emulated access stack, with a passphrase folder
    whose files say what they are; and what those commands store in each GitHub environment."""
    folder = tmp_path_factory.mktemp("passphrases")
    for environment in ("dev", "prod"):
        (folder / f"{environment}.txt").write_text(f"{environment} environment passphrase")
        (folder / f"{environment}-experiments.txt").write_text(f"{environment} experiments passphrase")
    lines = github_commands(cloud.access["github"], REPOSITORY, ["team:ml-platform"], folder)
    return folder, lines, stored_secrets(lines)


class TestPassphrases:
    """Each GitHub environment holds what the access setup's `gh secret set` commands store in
    it (tests/github_gate.py reads them back): prod's environment passphrase reaches prod's
    reviewed deploy job, never teardown-prod's, which runs without reviewers."""

    def job(self, environment: str, stored: dict) -> JobAccess:
        return job_access({"environment": environment, "permissions": {"id-token": "write"}}, repository=REPOSITORY,
                          event="schedule", ref="refs/heads/main", environments=["dev", "prod"], stored=stored)

    def test_teardown_prod_reads_only_the_experiments_passphrase_file(self, passphrases):
        folder, lines, _ = passphrases
        reads = [shlex.split(line)[-1] for line in lines
                 if line.startswith("gh secret set ") and " --env teardown-prod " in line]
        assert reads == [str(folder / "prod-experiments.txt")]

    def test_the_teardown_prod_job_never_gets_prods_environment_passphrase(self, passphrases):
        _, _, stored = passphrases
        access = self.job("teardown-prod", stored)
        assert access.subject == f"repo:{REPOSITORY}:environment:teardown-prod"
        assert "prod environment passphrase" not in access.values.values()
        assert access.values == {"PULUMI_CONFIG_PASSPHRASE": "prod experiments passphrase"}

    def test_the_prod_job_gets_both_of_prods_passphrases(self, passphrases):
        _, _, stored = passphrases
        assert self.job("prod", stored).values == {"PULUMI_CONFIG_PASSPHRASE": "prod environment passphrase",
                                                   "PULUMI_EXPERIMENTS_PASSPHRASE": "prod experiments passphrase"}

    def test_no_dev_job_gets_a_prod_passphrase(self, passphrases):
        _, _, stored = passphrases
        for environment in ("dev", "teardown-dev"):
            values = self.job(environment, stored).values
            assert values and not any(v.startswith("prod ") for v in values.values()), environment


class TestExperimentTarget:
    """The experiment's target is one fact: aml-hpc:environment."""

    def test_environment_stack_of_another_environment_is_refused(self, tmp_path):
        from amlhpc.core.errors import UserError
        from amlhpc.infra.config import load_stack_config

        path = tmp_path / "Pulumi.exp-sneak.yaml"
        path.write_text(yaml.safe_dump({"config": {
            "azure-native:location": "eastus", "aml-hpc:owner": "a@example.com", "aml-hpc:environment": "dev",
            "aml-hpc:environmentStack": "organization/aml-hpc/prod", "aml-hpc:expiresAt": "2030-01-01",
            "aml-hpc:clusters": [{"name": "sneak", "sku": "Standard_ND96isr_H100_v5", "maxNodes": 2}]}}))
        with pytest.raises(UserError) as info:
            load_stack_config("exp-sneak", tmp_path)
        assert "'organization/aml-hpc/prod' is not the stack of aml-hpc:environment 'dev'" in info.value.render()

    def test_a_prod_experiment_in_the_dev_job_is_refused_by_the_script(self, tmp_path):
        (tmp_path / "scripts").mkdir()
        (tmp_path / "scripts" / "pulumi-stack.sh").write_bytes((REPO_ROOT / "scripts" / "pulumi-stack.sh").read_bytes())
        (tmp_path / "Pulumi.exp-sneak.yaml").write_text("config:\n  aml-hpc:environment: prod\n")
        result = subprocess.run(["bash", "scripts/pulumi-stack.sh", "up", "exp-sneak"], cwd=tmp_path, text=True,
                                capture_output=True, env={"PATH": "/usr/bin:/bin", "AMLHPC_ENVIRONMENT": "dev"})
        assert result.returncode == 2
        assert "belongs to environment 'prod', and this job runs as environment 'dev'" in result.stderr

    def test_dev_identity_cannot_add_clusters_to_prods_workspace(self, cloud):
        refused(cloud.rbac.check(cloud.ci("dev", "deploy"), f"{ML}/computes/write",
                                 f"{cloud.workspace(cloud.prod)}/computes/sneak"), "does not cover")


class TestSubmittersJobOnTheControllerCluster:
    """Azure ML lets anyone with amlhpc/jobs/write target any cluster of the workspace, and the job then
    acts as that cluster's identity: Azure cannot stop a submitter's job from running on the
    controller's cluster. What keeps it harmless: the controller's identity can do nothing the
    submitter could not, so the job gains nothing."""

    def test_the_submitter_may_target_the_controller_cluster(self, cloud):
        job = f"{cloud.workspace(cloud.dev)}/jobs/anything"
        assert cloud.rbac.check(SUBMITTERS, f"{ML}/jobs/write", job).allowed

    @pytest.mark.parametrize("action, scope, data, reason", [
        (f"{ML}/datastores/listsecrets/action", "workspace", False, "managed-run controller"),
        (f"{ML}/connections/listsecrets/action", "workspace", False, "managed-run controller"),
        (f"{ML}/jobs/delete", "workspace", False, "managed-run controller"),
        (f"{ML}/computes/delete", "workspace", False, "managed-run controller"),
        (BLOB_WRITE, "checkpoints", True, "Storage Blob Data Reader at"),
        (BLOB_WRITE, "datasets", True, "does not cover"),
    ])
    def test_as_the_controller_identity_it_gains_nothing(self, cloud, action, scope, data, reason):
        """Secrets, deletes, another run's checkpoints, the datasets: refused to the controller's
        identity (it held AzureML Data Scientist and checkpoint write before)."""
        controller = cloud.dev["controller"]["identity"]["principalId"]
        target = (f"{cloud.workspace(cloud.dev)}/x" if scope == "workspace"
                  else f"{cloud.container(cloud.dev, scope)}/another-run/manifest.json")
        refused(cloud.rbac.check(controller, action, target, data=data), f"denied {action}", reason)

    def test_a_gpu_job_cannot_write_the_controllers_records(self, cloud):
        """The other way round: a job on a GPU cluster (the compute identity) cannot forge a
        supervision record or a cancel request; the controller and the submitters can."""
        record = f"{cloud.container(cloud.dev, 'supervision')}/cosmoflow/run-1/supervision.json"
        refused(cloud.rbac.check(cloud.dev["identity"]["principalId"], BLOB_WRITE, record, data=True),
                "does not cover")
        assert cloud.rbac.check(cloud.dev["controller"]["identity"]["principalId"], BLOB_WRITE, record, data=True).allowed
        assert cloud.rbac.check(SUBMITTERS, BLOB_WRITE, record, data=True).allowed

    def test_dev_controller_reaches_its_job_storage(self, cloud):
        """dev's workspace storage takes no keys: the controller's job I/O goes through its identity."""
        ws_storage = next(o for o in cloud.azure.of_type("azure-native:storage:StorageAccount")
                          if o.name.startswith("amlhpcdevws"))
        assert cloud.rbac.check(cloud.dev["controller"]["identity"]["principalId"], BLOB_WRITE,
                                f"{ws_storage.id}/blobServices/default/containers/azureml/ExperimentRun/x", data=True).allowed


class TestJobsCannotWriteCode:
    """Every job runs as the GPU clusters' identity, and the workspace storage holds every job's
    code snapshot and the controller's code asset: a job that could overwrite them would run its
    code in the next job, or as the controller on its next attempt or revival. The identity's
    write on the workspace storage is conditioned to run history and default outputs."""

    SNAPSHOT = "azureml-blobstore-0f3c2a9e-1b7d-4c8e-a6f0-2b7d9e4c1a35/LocalUpload/9d1e0c/cosmoflow/controller.py"

    def ws_blob(self, cloud, blob: str) -> str:
        account = next(o for o in cloud.azure.of_type("azure-native:storage:StorageAccount")
                       if o.name.startswith("amlhpcdevws"))
        return f"{account.id}/blobServices/default/containers/{blob}"

    @pytest.mark.parametrize("who", ["compute", "controller"])
    @pytest.mark.parametrize("action", [BLOB_WRITE, "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/delete",
                                        "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/add/action"])
    def test_a_job_overwriting_a_code_snapshot_is_refused(self, cloud, who, action):
        principal = (cloud.dev["identity"] if who == "compute" else cloud.dev["controller"]["identity"])["principalId"]
        refused(cloud.rbac.check(principal, action, self.ws_blob(cloud, self.SNAPSHOT), data=True),
                f"its condition does not allow {action} on azureml-blobstore-", "/LocalUpload/")

    @pytest.mark.parametrize("who", ["compute", "controller"])
    @pytest.mark.parametrize("blob", ["azureml/ExperimentRun/dcid.run-1/user_logs/std_log.txt",
                                      "azureml-blobstore-0f3c2a9e-1b7d-4c8e-a6f0-2b7d9e4c1a35/azureml/run-1/outputs/m.json"])
    def test_a_job_still_writes_its_logs_and_outputs_and_reads_its_code(self, cloud, who, blob):
        principal = (cloud.dev["identity"] if who == "compute" else cloud.dev["controller"]["identity"])["principalId"]
        assert cloud.rbac.check(principal, BLOB_WRITE, self.ws_blob(cloud, blob), data=True).allowed
        assert cloud.rbac.check(principal, BLOB_READ, self.ws_blob(cloud, self.SNAPSHOT), data=True).allowed

    def test_the_submitter_still_uploads_code(self, cloud):
        assert cloud.rbac.check(SUBMITTERS, BLOB_WRITE, self.ws_blob(cloud, self.SNAPSHOT), data=True).allowed

    def test_a_path_that_only_looks_like_an_output_is_refused(self, cloud):
        """`azureml` only as the container of run history, `azureml/` only as a path prefix."""
        principal = cloud.dev["identity"]["principalId"]
        for blob in ("azureml/LocalUpload/x.py", "azureml-blobstore-0f3c/LocalUpload/azureml/x.py",
                     "snapshots/ExperimentRun/x.py"):
            refused(cloud.rbac.check(principal, BLOB_WRITE, self.ws_blob(cloud, blob), data=True),
                    "its condition does not allow")
