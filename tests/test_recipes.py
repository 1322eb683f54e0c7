"""Recipes: every shipped recipe validates; bad fields and overrides fail with path and hint."""

from __future__ import annotations

import pytest

from amlhpc.core.errors import UserError
from amlhpc.jobs import recipes

SHIPPED = {"cosmoflow", "cosmoflow-tf", "maskrcnn", "bert-pretrain", "nccl-allreduce", "node-health"}


class TestShipped:
    def test_all_seed_workloads_are_shipped(self):
        """The issue's recipes are all there."""
        assert SHIPPED <= set(recipes.available())

    @pytest.mark.parametrize("name", sorted(SHIPPED))
    def test_each_validates(self, name):
        """Each shipped recipe passes the schema and keeps its name."""
        assert recipes.load(name).name == name

    def test_frameworks_and_distributions(self):
        """NAG's CosmoFlow tutorial TF+Horovod uses MPI, NAG's Mask R-CNN tutorial MPI, Azure's large-scale training guide DeepSpeed, CosmoFlow port DDP."""
        assert recipes.load("cosmoflow-tf").framework == "tensorflow"
        assert recipes.load("cosmoflow-tf").distribution == "mpi"
        assert recipes.load("maskrcnn").distribution == "mpi"
        assert recipes.load("bert-pretrain").distribution == "deepspeed"
        assert recipes.load("cosmoflow").inputs["cosmoflow"].mode == "stage"
        assert recipes.load("maskrcnn").prepare


class TestErrors:
    def test_unknown_recipe_suggests(self):
        """A typo names the recipe and suggests the near match."""
        with pytest.raises(UserError) as info:
            recipes.load("cosmoflw")
        text = info.value.render()
        assert "unknown recipe 'cosmoflw'" in text and "did you mean cosmoflow" in text

    def test_wrong_type(self, tmp_path):
        """A field with a wrong type names the file, the key and the value."""
        bad = tmp_path / "bad.yaml"
        bad.write_text("name: bad\ncommand: python x.py\nnodes: two\n")
        with pytest.raises(UserError) as info:
            recipes.load(str(bad))
        text = info.value.render()
        assert "bad.yaml: nodes: 'two'" in text and "valid integer" in text

    def test_unknown_key_did_you_mean(self, tmp_path):
        bad = tmp_path / "bad.yaml"
        bad.write_text("name: bad\ncommand: x\ninputs:\n  data:\n    path: p\n    mdoe: stage\n")
        with pytest.raises(UserError) as info:
            recipes.load(str(bad))
        assert "inputs.data.mdoe: unknown key 'mdoe'" in info.value.render()
        assert "did you mean 'mode'?" in info.value.render()

    def test_override_with_wrong_value_is_attributed(self):
        """A bad --set value is reported at its path, marked as coming from --set."""
        with pytest.raises(UserError) as info:
            recipes.load("cosmoflow", recipes.parse_overrides(["inputs.cosmoflow.mode=bogus"]))
        text = info.value.render()
        assert "inputs.cosmoflow.mode: 'bogus' (from --set)" in text and "'stage', 'download' or 'ro_mount'" in text

    def test_malformed_set(self):
        with pytest.raises(UserError) as info:
            recipes.parse_overrides(["nodes"])
        assert "is not key=value" in info.value.render()

    def test_deepspeed_needs_block(self, tmp_path):
        bad = tmp_path / "bad.yaml"
        bad.write_text("name: bad\ncommand: x\ndistribution: deepspeed\n")
        with pytest.raises(UserError) as info:
            recipes.load(str(bad))
        assert "needs a `deepspeed:` block" in info.value.render()

    def test_shm_size_format(self):
        with pytest.raises(UserError) as info:
            recipes.load("cosmoflow", {"shm_size": "lots"})
        assert "shm_size: 'lots'" in info.value.render()


class TestOverrides:
    def test_values_are_yaml_typed(self):
        """--set values are parsed as YAML: numbers, booleans, null."""
        assert recipes.parse_overrides(["nodes=3", "checkpoint.enabled=false", "x.y=null"]) == \
            {"nodes": 3, "checkpoint.enabled": False, "x.y": None}

    def test_words_and_env_values_stay_strings(self):
        """health=off stays 'off' (not YAML 1.1 false); env and tag values are always strings."""
        assert recipes.parse_overrides(["health=off", "env.NCCL_ALGO=1", "tags.team=on"]) == \
            {"health": "off", "env.NCCL_ALGO": "1", "tags.team": "on"}
        assert recipes.load("cosmoflow", recipes.parse_overrides(["health=off"])).health == "off"

    def test_override_wins_over_file(self):
        r = recipes.load("cosmoflow", recipes.parse_overrides(["nodes=1", "inputs.cosmoflow.mode=download", "env.FOO=bar"]))
        assert r.nodes == 1 and r.inputs["cosmoflow"].mode == "download" and r.env == {"FOO": "bar"}


class TestRecipeConsistency:
    """Inputs the schema refuses (issue: accepted before)."""

    def _load(self, tmp_path, **changes):
        import yaml

        from amlhpc.jobs import recipes

        doc = yaml.safe_load(recipes.resolve("cosmoflow").read_text())
        doc.update(changes)
        path = tmp_path / "r.yaml"
        path.write_text(yaml.safe_dump(doc))
        return recipes.load(str(path))

    def test_empty_command_is_refused(self, tmp_path):
        from amlhpc.core.errors import UserError

        with pytest.raises(UserError) as info:
            self._load(tmp_path, command="   ")
        assert "command" in info.value.render() and "is empty" in info.value.render()

    def test_pytorch_code_under_tensorflow_distribution_is_refused(self, tmp_path):
        from amlhpc.core.errors import UserError

        with pytest.raises(UserError) as info:
            self._load(tmp_path, framework="pytorch", distribution="tensorflow")
        assert "framework pytorch cannot use distribution tensorflow" in info.value.render()

    def test_maskrcnn_is_pinned_to_a_commit(self):
        import re

        from amlhpc.jobs import recipes

        revision = recipes.load("maskrcnn").env["MASKRCNN_REVISION"]
        assert re.fullmatch(r"[0-9a-f]{40}", revision), revision


class TestSharedDir:
    """inputs.<name>.shared_dir becomes `docker -v DIR:DIR`: only a plain data folder passes."""

    @pytest.mark.parametrize("value", ["/mnt/beeond", "/mnt/resource_nvme/beeond", "/scratch/shared-1"])
    def test_data_folders_pass(self, value):
        assert recipes.load("cosmoflow", {"inputs.cosmoflow.shared_dir": value}).inputs["cosmoflow"].shared_dir == value

    @pytest.mark.parametrize("value, reason", [
        ("/mnt/beeond --privileged", "not a plain absolute folder"),
        ("/mnt/x:/host", "not a plain absolute folder"),
        ("/mnt/x,readonly", "not a plain absolute folder"),
        ("mnt/beeond", "not a plain absolute folder"),
        ("/mnt/../etc", "not a plain absolute folder"),
        ("/mnt/beeond/", "not a plain absolute folder"),
        ("/", "not a plain absolute folder"),
        ("/mnt", "system folder"),
        ("/var/run/docker.sock", "system folder"),
        ("/etc/ssh", "system folder"),
        ("/root/keys", "system folder"),
        ("/mnt/.hidden", "not a plain absolute folder"),
        ("/proc/1", "system folder"),
    ])
    def test_anything_else_is_refused_by_key(self, value, reason):
        with pytest.raises(UserError) as info:
            recipes.load("cosmoflow", {"inputs.cosmoflow.shared_dir": value})
        text = info.value.render()
        assert "inputs.cosmoflow.shared_dir" in text and reason in text and "/mnt/beeond" in text
