"""amlhpc.jobs.plan.build: every recipe x stack renders to YAML that azure.ai.ml.load_job loads, with the
distribution, counts, per-SKU environment, inputs, services and shm_size it should have."""

from __future__ import annotations

import json

import pytest
from azure.ai.ml import load_job

from amlhpc.core import skus
from amlhpc.core.errors import UserError
from amlhpc.jobs import recipes
from amlhpc.jobs.plan import build
from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.launch import watchdog
from tests.jobs_helpers import STACKS, stack_outputs

RECIPES = recipes.available()


def _render(tmp_path, recipe_name, stack, **kwargs):
    plan = build.plan_job(recipes.load(recipe_name, kwargs.pop("overrides", None)), stack_outputs(stack), **kwargs)
    code = build.snapshot(plan.code_dirs, dest_root=tmp_path / "snap")
    path = tmp_path / f"{recipe_name}-{stack}.yml"
    path.write_text(build.to_yaml(plan, code))
    return plan, load_job(path)


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_loads_with_load_job(tmp_path, name, stack):
    """The dry-run YAML of each recipe on dev and prod is a valid Azure ML command job."""
    plan, job = _render(tmp_path, name, stack)
    sku = skus.get(plan.sku)
    assert job.type == "command"
    assert job.compute == plan.cluster
    assert job.resources.instance_count == plan.instance_count
    assert job.resources.shm_size == "3100m"
    assert job.distribution.type == plan.distribution
    if plan.distribution == "tensorflow":
        assert job.distribution.worker_count == plan.instance_count
    else:
        assert job.distribution.process_count_per_instance == sku.gpus
    assert job.environment_variables[contract.SKU_JSON] == json.dumps(json.loads(job.environment_variables[contract.SKU_JSON]), sort_keys=True, separators=(",", ":"))
    assert json.loads(job.environment_variables[contract.SKU_JSON])["name"] == sku.name
    assert job.command.startswith(("python -m amlhpc.jobs.runtime.launch ", "env ", "bash -c "))
    assert " -- " in job.command
    assert job.identity.client_id == stack_outputs(stack).identity.client_id
    assert job.limits.timeout == plan.timeout_s


class TestDistribution:
    def test_cosmoflow_pytorch_ddp_on_dev(self, tmp_path):
        """cosmoflow on dev: 2 x ND96asr_v4, torch.distributed with 8 processes per node."""
        plan, job = _render(tmp_path, "cosmoflow", "dev")
        assert (plan.cluster, plan.sku) == ("nd-a100", "Standard_ND96asr_v4")
        assert job.distribution.type == "pytorch" and job.distribution.process_count_per_instance == 8
        assert job.resources.instance_count == 2

    def test_deepspeed_launches_through_torch_distributed(self, tmp_path):
        """bert-pretrain (DeepSpeed) uses distribution pytorch: no ssh hostfile."""
        plan, job = _render(tmp_path, "bert-pretrain", "prod")
        assert plan.recipe_distribution == "deepspeed" and job.distribution.type == "pytorch"
        ds = json.loads(job.environment_variables["AMLHPC_DEEPSPEED_JSON"])
        assert ds["config"]["zero_optimization"]["stage"] == 1  # 336M params: the table of Azure's large-scale training guide
        assert ds["config"]["bf16"] == {"enabled": True}  # H100
        assert ds["config"]["train_batch_size"] == 64 * 2 * 8

    def test_mpi_recipes(self, tmp_path):
        for name in ("cosmoflow-tf", "maskrcnn"):
            _, job = _render(tmp_path, name, "prod")
            assert job.distribution.type == "mpi" and job.distribution.process_count_per_instance == 8
            assert job.environment_variables["OMPI_MCA_pml"] == "ucx"

    def test_processes_per_node_override(self, tmp_path):
        plan, job = _render(tmp_path, "cosmoflow", "dev", processes_per_node=4)
        assert job.distribution.process_count_per_instance == 4 and plan.world_size == 8


class TestEnvironmentPerSku:
    def test_ndv4_tuning(self, tmp_path):
        _, job = _render(tmp_path, "cosmoflow", "dev")
        env = job.environment_variables
        assert env["NCCL_IB_PCI_RELAXED_ORDERING"] == "1" and env["UCX_IB_PCI_RELAXED_ORDERING"] == "on"
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["NCCL_SOCKET_IFNAME"] == "eth0"
        assert env["NCCL_TOPO_FILE"].endswith("/ndv4-topo.xml")
        assert env["OMPI_MCA_coll_hcoll_enable"] == "0"
        assert "NCCL_IB_DISABLE" not in env
        assert json.loads(env[contract.SKU_JSON])["numa"][0] == {"node": 0, "cpulist": "0-23", "gpu_ids": [2, 3]}
        assert env[contract.PIN] == "auto" and env[contract.HEALTH] == "gate"

    def test_h100_topology_file(self, tmp_path):
        _, job = _render(tmp_path, "cosmoflow", "prod")
        assert job.environment_variables["NCCL_TOPO_FILE"].endswith("/ndv5-topo.xml")

    def test_single_node_without_infiniband(self, tmp_path):
        """nc-a100 (no IB, 1 GPU): no IB variables, one process."""
        plan, job = _render(tmp_path, "cosmoflow", "dev", cluster="nc-a100", nodes=1)
        env = job.environment_variables
        assert plan.processes_per_node == 1
        assert "NCCL_IB_PCI_RELAXED_ORDERING" not in env and "NCCL_TOPO_FILE" not in env

    def test_recipe_nccl_ib_disable_is_stripped(self, tmp_path):
        """NCCL_IB_DISABLE from a recipe never reaches an IB job; the user is warned."""
        plan, job = _render(tmp_path, "cosmoflow", "dev", overrides={"env.NCCL_IB_DISABLE": "1"})
        assert "NCCL_IB_DISABLE" not in job.environment_variables
        assert any("dropped NCCL_IB_DISABLE" in w for w in plan.warnings)

    def test_checkpoint_cap_under_ingress(self, tmp_path):
        """Uploading nodes x cap stay under 90 % of the account ingress (the NDv4 performance article); one
        process per node uploads, so per-rank writers share their node's cap."""
        plan, job = _render(tmp_path, "bert-pretrain", "dev")
        ckpt = json.loads(job.environment_variables[contract.CHECKPOINT_JSON])
        assert ckpt["writers"] == "per_rank" and ckpt["ingress_gbps"] == 25
        uploading_nodes = plan.instance_count
        assert uploading_nodes * ckpt["cap_mbps"] <= 25_000 * 0.9
        assert (uploading_nodes + 1) * ckpt["cap_mbps"] > 25_000 * 0.9, "the cap uses the share, not a token value"
        assert ckpt["container"] == "checkpoints" and ckpt["prefix"] == f"bert-pretrain/{plan.name}"

    def test_checkpoint_accounts_are_striped_and_share_their_ingress(self, tmp_path):
        """The stack's checkpointAccounts (in striping order) reach the job; the first holds the
        manifests, and the per-node cap is the nodes' share of every account's ingress together."""
        outputs = stack_outputs("dev")
        object.__setattr__(outputs, "checkpoint_accounts", ["devck1", "devck2", "devck3"])  # the stack output
        plan = build.plan_job(recipes.load("bert-pretrain", None), outputs)
        ckpt = json.loads(plan.environment_variables[contract.CHECKPOINT_JSON])
        assert ckpt["accounts"] == ["devck1", "devck2", "devck3"]
        assert ckpt["account_url"] == "https://devck1.blob.core.windows.net/"
        assert plan.instance_count * ckpt["cap_mbps"] <= 3 * 25_000 * 0.9 < (plan.instance_count + 1) * ckpt["cap_mbps"]

    def test_resume_uses_earlier_prefix(self, tmp_path):
        _, job = _render(tmp_path, "cosmoflow", "dev", resume="cosmoflow-20260101-000000-abcd")
        assert json.loads(job.environment_variables[contract.CHECKPOINT_JSON])["prefix"] == "cosmoflow/cosmoflow-20260101-000000-abcd"


class TestInputs:
    def test_stage_mounts_nothing(self, tmp_path):
        """mode stage: no Azure ML input; the launcher gets AMLHPC_STAGE_JSON with the stack's endpoint."""
        _, job = _render(tmp_path, "cosmoflow", "dev")
        assert not job.inputs
        staged = json.loads(job.environment_variables[contract.STAGE_JSON])
        assert staged == [{"name": "cosmoflow", "account_url": "https://amlhpcdevds4abd2.blob.core.windows.net/",
                           "container": "datasets", "prefix": "cosmoflow/cosmoUniverse_2019_05_4parE_tf/",
                           "mode": "local", "egress_gbps": 50.0, "version": "latest"}]

    def test_a_staged_input_names_its_dataset_version(self, tmp_path):
        _, job = _render(tmp_path, "cosmoflow", "dev", overrides={"inputs.cosmoflow.version": "3"})
        assert json.loads(job.environment_variables[contract.STAGE_JSON])[0]["version"] == 3

    def test_a_mounted_input_reads_one_version_folder(self, tmp_path):
        """Azure ML mounts a folder: a named version is its v<k>/ folder, and a whole folder is warned about."""
        plan, job = _render(tmp_path, "maskrcnn", "dev", overrides={"inputs.coco.version": "2"})
        assert job.inputs["coco"].path == "azureml://datastores/datasets/paths/coco2017/v2/"
        assert not any("reads the folder" in w for w in plan.warnings)
        plan, _ = _render(tmp_path, "maskrcnn", "dev")
        assert any("reads the folder coco2017/ whole" in w and "inputs.coco.version=K" in w for w in plan.warnings)

    def test_download_input_on_datasets_datastore(self, tmp_path):
        _, job = _render(tmp_path, "maskrcnn", "dev")
        assert job.inputs["coco"].mode == "download"
        assert job.inputs["coco"].path == "azureml://datastores/datasets/paths/coco2017/"
        assert "AMLHPC_DATA_DIR_COCO=${{inputs.coco}}" in job.command

    @pytest.mark.parametrize("mode", ["ro_mount", "download"])
    def test_mode_override(self, tmp_path, mode):
        _, job = _render(tmp_path, "cosmoflow", "dev", overrides={"inputs.cosmoflow.mode": mode})
        assert job.inputs["cosmoflow"].mode == mode and contract.STAGE_JSON not in job.environment_variables

    def test_shared_placement_mounts_beeond(self, tmp_path):
        plan, job = _render(tmp_path, "cosmoflow-tf", "prod", overrides={"inputs.cosmoflow.placement": "shared"})
        assert job.resources.docker_args == "-v /mnt/beeond:/mnt/beeond"
        assert job.environment_variables[contract.SHARED_DIR] == "/mnt/beeond"


class TestServicesAndSwitches:
    def test_services(self, tmp_path):
        _, job = _render(tmp_path, "bert-pretrain", "dev", overrides={"services.jupyter_lab": True, "services.vs_code": True})
        assert {k: v.type for k, v in job.services.items()} == {"tensorboard": "tensor_board", "jupyter_lab": "jupyter_lab", "vs_code": "vs_code"}
        assert job.services["tensorboard"].log_dir == "outputs/tensorboard"

    def test_profiling_switch(self, tmp_path):
        _, job = _render(tmp_path, "cosmoflow", "dev", overrides={"profiling.enabled": True})
        assert job.environment_variables["AMLHPC_PROFILE_DIR"] == "outputs/tensorboard/profiler"

    def test_watchdog_look_interval_reaches_the_launcher(self, tmp_path):
        _, job = _render(tmp_path, "bert-pretrain", "dev", overrides={"watchdog.hang_s": 30, "watchdog.check_s": 2})
        settings = watchdog.parse_settings(job.environment_variables[contract.WATCHDOG_JSON])
        assert (settings.hang_s, settings.interval_s) == (30, 2)
        _, job = _render(tmp_path, "bert-pretrain", "dev", overrides={"watchdog.hang_s": 30})
        assert watchdog.parse_settings(job.environment_variables[contract.WATCHDOG_JSON]).interval_s == 5, "hang_s / 6"

    def test_shm_size_override(self, tmp_path):
        _, job = _render(tmp_path, "cosmoflow", "dev", overrides={"shm_size": "16g"})
        assert job.resources.shm_size == "16g"


class TestErrors:
    def _plan(self, name="cosmoflow", stack="dev", overrides=None, **kwargs):
        return build.plan_job(recipes.load(name, overrides), stack_outputs(stack), **kwargs)

    def test_unknown_cluster(self):
        with pytest.raises(UserError) as info:
            self._plan(cluster="nd-a10")
        assert "unknown cluster 'nd-a10'" in info.value.render() and "did you mean 'nd-a100'" in info.value.render()

    def test_nodes_above_cluster_max(self):
        with pytest.raises(UserError) as info:
            self._plan(nodes=3)
        assert "3 nodes requested but cluster 'nd-a100' scales to at most 2" in info.value.render()

    def test_processes_above_gpus(self):
        with pytest.raises(UserError) as info:
            self._plan(overrides={"processes_per_node": 16})
        assert "16 processes per node but Standard_ND96asr_v4 has 8 GPUs" in info.value.render()

    def test_missing_input_path(self):
        with pytest.raises(UserError) as info:
            self._plan(overrides={"inputs.cosmoflow.path": None})
        text = info.value.render()
        assert "inputs.cosmoflow.path: input 'cosmoflow' has no path" in text and "--set inputs.cosmoflow.path=" in text

    def test_command_references_undeclared_input(self):
        with pytest.raises(UserError) as info:
            self._plan(overrides={"command": "python train.py --data ${{inputs.imagenet}}"})
        assert "declares no input 'imagenet'" in info.value.render()

    def test_multi_node_tcp_refused_unless_allowed(self):
        outputs = stack_outputs("dev")
        nc = outputs.clusters["nc-a100"].model_copy(update={"max_nodes": 4})
        patched = outputs.model_copy(update={"clusters": {**outputs.clusters, "nc-a100": nc}})
        recipe = recipes.load("cosmoflow")
        with pytest.raises(UserError) as info:
            build.plan_job(recipe, patched, cluster="nc-a100", nodes=2)
        assert "have no InfiniBand" in info.value.render() and "--allow-tcp" in info.value.render()
        plan = build.plan_job(recipe, patched, cluster="nc-a100", nodes=2, allow_tcp=True)
        assert plan.environment_variables["NCCL_SOCKET_IFNAME"] == "eth0"
        assert any("TCP" in w for w in plan.warnings)

    def test_unregistered_environment(self):
        with pytest.raises(UserError) as info:
            self._plan(overrides={"environment.registered": "aml-hpc-jax"})
        assert "'aml-hpc-jax' is not registered in stack 'dev'" in info.value.render()

    def test_all_problems_at_once(self):
        """Independent problems are reported together."""
        with pytest.raises(UserError) as info:
            self._plan(overrides={"inputs.cosmoflow.path": None, "environment.registered": "nope"})
        assert len(info.value.problems) == 2


class TestPrepareBarrier:
    def test_runs_once_per_node_and_others_wait(self, tmp_path):
        """The prepare wrapper runs the step on local rank 0 only; rank 1 waits and then runs."""
        import subprocess

        log = tmp_path / "prepared.log"
        plan = build.plan_job(recipes.load("cosmoflow", {"prepare": f"sleep 0.5; echo once >> {log}",
                                                          "command": "true"}), stack_outputs("dev"))
        script = plan.command.replace("python -m amlhpc.jobs.runtime.launch -- true", f"echo ran >> {tmp_path}/ranks.log")
        procs = [subprocess.Popen(["bash", "-c", f"export LOCAL_RANK={r} AMLHPC_SCRATCH={tmp_path}/scratch AZUREML_RUN_ID=t1; {script}"])
                 for r in (1, 0)]
        assert [p.wait(timeout=30) for p in procs] == [0, 0]
        assert log.read_text() == "once\n"
        assert (tmp_path / "ranks.log").read_text() == "ran\nran\n"

    def test_failure_stops_every_rank(self, tmp_path):
        import subprocess

        plan = build.plan_job(recipes.load("cosmoflow", {"prepare": "exit 3", "command": "true"}), stack_outputs("dev"))
        procs = [subprocess.Popen(["bash", "-c", f"export LOCAL_RANK={r} AMLHPC_SCRATCH={tmp_path} AZUREML_RUN_ID=t2; {plan.command}"],
                                  stderr=subprocess.PIPE, text=True) for r in (0, 1)]
        results = [(p.wait(timeout=30), p.stderr.read()) for p in procs]
        assert all(rc != 0 for rc, _ in results)
        assert "prepare failed" in results[1][1]


class TestSnapshot:
    def test_contains_runtime_and_workloads_only(self, tmp_path):
        snap = build.snapshot(("amlhpc/jobs/runtime", "amlhpc/jobs/workloads"), dest_root=tmp_path)
        names = {p.relative_to(snap).as_posix() for p in snap.rglob("*.py")}
        assert "amlhpc/jobs/__init__.py" in names and "amlhpc/jobs/runtime/base/contract.py" in names
        assert "amlhpc/jobs/workloads/cosmoflow/train.py" in names
        assert not any(n.startswith(("amlhpc/jobs/cli", "amlhpc/infra/", "tests/")) for n in names)
        assert build.snapshot(("amlhpc/jobs/runtime", "amlhpc/jobs/workloads"), dest_root=tmp_path) == snap  # content-addressed

    def test_topology_dir_matches_images(self):
        """The NCCL topology path the jobs set is where the images install the files."""
        catalog = pytest.importorskip("amlhpc.images.catalog")
        from amlhpc.jobs.plan import tuning

        assert tuning.NCCL_TOPO_DIR == catalog.NCCL_TOPO_DIR


@pytest.fixture(scope="module")
def offline_outputs():
    """The real offline plan's outputs (amlhpc.infra.plan), once per stack."""
    from amlhpc.jobs.plan import outputs

    return {stack: outputs.load(stack, offline=True).outputs for stack in STACKS}


@pytest.mark.parametrize("stack", STACKS)
def test_every_recipe_renders_against_the_real_offline_plan(tmp_path, offline_outputs, stack):
    """`--dry-run --offline`: every recipe against the offline plan, loaded by load_job."""
    for name in RECIPES:
        plan = build.plan_job(recipes.load(name), offline_outputs[stack])
        path = tmp_path / f"{name}.yml"
        path.write_text(build.to_yaml(plan, build.snapshot(plan.code_dirs, dest_root=tmp_path / "snap")))
        job = load_job(path)
        registered = recipes.load(name).environment.registered
        # the environment the stack registered for the image (version = the image's tag)
        tag = offline_outputs[stack].registry.environments[registered].rsplit(":", 1)[1]
        assert offline_outputs[stack].registry.environment_ids[registered] == f"azureml:{registered}:{tag}"
        assert job.environment.removeprefix("azureml:") == f"{registered}:{tag}"  # load_job drops the prefix
        assert job.resources.instance_count == plan.instance_count


class TestMaxClocks:
    def test_recipe_switch_reaches_the_launcher(self, tmp_path):
        plan, _ = _render(tmp_path, "nccl-allreduce", "dev")
        assert "python -m amlhpc.jobs.runtime.launch --max-clocks -- " in plan.command

    def test_off_by_default(self, tmp_path):
        plan, _ = _render(tmp_path, "cosmoflow", "dev")
        assert "--max-clocks" not in plan.command
