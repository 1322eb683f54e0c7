"""amlhpc.images.catalog and amlhpc.images.context: what goes into each build context, and the
content-hash tag - stable across machines, changed by anything that shapes the image,
unchanged by anything that does not."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from amlhpc.images import catalog, context
from amlhpc.images.pins import load_pins
from tests.source_imports import imports_of

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo(tmp_path):
    """A copy of just what the images are made of: amlhpc/images/ and amlhpc/jobs/runtime/."""
    shutil.copytree(ROOT / "amlhpc" / "images", tmp_path / "amlhpc" / "images", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "amlhpc" / "jobs" / "runtime", tmp_path / "amlhpc" / "jobs" / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def tags(root: Path) -> dict[str, str]:
    return {r.spec.name: r.tag for r in catalog.releases(root)}


def edit_pins(root: Path, old: str, new: str) -> None:
    path = root / "amlhpc" / "images" / "pins.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


class TestSpecs:
    def test_four_images_with_contract_names(self):
        assert [s.name for s in catalog.IMAGES] == ["aml-hpc-pytorch", "aml-hpc-pytorch-arm64", "aml-hpc-rocm",
                                                    "aml-hpc-tensorflow"]
        assert [s.repository for s in catalog.IMAGES] == ["aml-hpc/pytorch", "aml-hpc/pytorch-arm64", "aml-hpc/rocm",
                                                          "aml-hpc/tensorflow"]
        assert all((ROOT / s.dockerfile).is_file() for s in catalog.IMAGES)
        assert [s.platform for s in catalog.IMAGES] == ["linux/amd64", "linux/arm64", "linux/amd64", "linux/amd64"]

    @pytest.mark.parametrize("name", ["aml-hpc-pytorch", "pytorch", "aml-hpc/pytorch"])
    def test_lookup_by_any_name(self, name):
        assert catalog.by_name(name) is catalog.PYTORCH

    def test_unknown_name(self):
        with pytest.raises(KeyError):
            catalog.by_name("jax")

    def test_build_args_resolve_every_pin(self):
        pins = load_pins()
        args = catalog.build_args(catalog.PYTORCH, pins)
        assert args["BASE_IMAGE"] == pins.pytorch.ref
        assert args["BASE_DIGEST"] == pins.pytorch.digest
        assert args["DEEPSPEED_VERSION"] == pins.python.deepspeed
        assert "HOROVOD_VERSION" not in args
        assert catalog.build_args(catalog.TENSORFLOW, pins)["HOROVOD_VERSION"] == pins.tensorflow.horovod
        assert not set(args) & set(catalog.NOT_HASHED_ARGS)


class TestRefs:
    def test_image_ref_and_environment_id(self):
        release = catalog.release(catalog.PYTORCH)
        assert release.ref("MyACR.azurecr.io") == f"myacr.azurecr.io/aml-hpc/pytorch:{release.tag}"
        assert release.ref("https://myacr.azurecr.io/") == f"myacr.azurecr.io/aml-hpc/pytorch:{release.tag}"
        assert release.environment_id == f"azureml:aml-hpc-pytorch:{release.tag}"

    @pytest.mark.parametrize("bad", ["", "myacr.azurecr.io/aml-hpc"])
    def test_login_server_must_be_a_host(self, bad):
        with pytest.raises(ValueError, match="host name"):
            catalog.image_ref(bad, "aml-hpc/pytorch", "0123456789ab")

    def test_ref_matches_the_outputs_contract_shape(self):
        """docs/contracts.md section 2: registry.environments holds <login>/aml-hpc/<name>:<hash>."""
        fixture_ref = "amlhpcdevacr4abd2.azurecr.io/aml-hpc/pytorch:0123456789ab"
        pattern = r"[a-z0-9]+\.azurecr\.io/aml-hpc/[a-z]+:[0-9a-f]{12}"
        assert re.fullmatch(pattern, fixture_ref)
        assert re.fullmatch(pattern, catalog.release(catalog.PYTORCH).ref("amlhpcdevacr4abd2.azurecr.io"))

    def test_the_runtime_looks_for_topology_files_where_the_images_install_them(self):
        from amlhpc.jobs.runtime.node import nccl_env

        assert catalog.NCCL_TOPO_DIR == nccl_env.IMAGE_TOPO_DIR == "/opt/aml-hpc/nccl-topo"


class TestContextFiles:
    def test_layout(self):
        files = context.context_files("pytorch")
        assert "Dockerfile" in files
        assert "aml-hpc/bin/check_ib_userspace.py" in files and "aml-hpc/bin/install_ib_userspace.sh" in files
        assert "aml-hpc/nccl-topo/ndv4-topo.xml" in files and "aml-hpc/ssh/aml-hpc.conf" in files
        assert "aml-hpc/python/amlhpc/jobs/runtime/base/contract.py" in files
        runtime = {p.relative_to(ROOT / "amlhpc" / "jobs" / "runtime").as_posix() for p in (ROOT / "amlhpc" / "jobs" / "runtime").rglob("*.py")
                   if "__pycache__" not in p.parts}
        assert {f"aml-hpc/python/amlhpc/jobs/runtime/{r}" for r in runtime} <= set(files)

    def test_jobs_package_is_a_generated_stub(self):
        """The repo's amlhpc/jobs/__init__.py belongs to the submit side; the image gets a stub."""
        stub = context.context_files("pytorch")["aml-hpc/python/amlhpc/jobs/__init__.py"].data.decode()
        assert "generates this file" in stub and "import" not in stub.split('"""')[2]

    def test_scripts_keep_their_executable_bit(self):
        files = context.context_files("pytorch")
        assert files["aml-hpc/bin/install_ib_userspace.sh"].executable
        assert files["aml-hpc/bin/check_ib_userspace.py"].executable
        assert not files["Dockerfile"].executable

    def test_litter_and_docs_stay_out(self, repo):
        (repo / "amlhpc" / "jobs" / "runtime" / "__pycache__").mkdir(exist_ok=True)
        (repo / "amlhpc" / "jobs" / "runtime" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
        (repo / "amlhpc" / "images" / "common" / "notes.swp").write_bytes(b"junk")
        files = context.context_files("pytorch", repo)
        assert not any("__pycache__" in f or f.endswith((".pyc", ".swp", ".md")) for f in files)

    def test_stage_writes_exactly_the_hashed_files(self, tmp_path):
        release = catalog.release(catalog.TENSORFLOW)
        staged = context.stage(dict(release.files), tmp_path / "ctx")
        assert context.content_hash(context.read_staged(staged), dict(release.build_args)) == release.tag
        assert os.access(staged / "aml-hpc" / "bin" / "install_ib_userspace.sh", os.X_OK)

    def test_stage_refuses_a_non_empty_folder(self, tmp_path):
        (tmp_path / "ctx").mkdir()
        (tmp_path / "ctx" / "old").write_text("x")
        with pytest.raises(FileExistsError, match="not empty"):
            context.stage(context.context_files("pytorch"), tmp_path / "ctx")


class TestContentHashTag:
    def test_shape(self):
        assert all(re.fullmatch(r"[0-9a-f]{12}", t) for t in tags(ROOT).values())

    def test_stable_across_runs_and_checkouts(self, repo):
        """Same files and pins in another folder: same tags (nothing machine-specific is hashed)."""
        assert tags(repo) == tags(repo) == tags(ROOT)

    def test_images_have_different_tags(self):
        """The two PyTorch builds share a Dockerfile: the host architecture's args set them apart."""
        assert len(set(tags(ROOT).values())) == len(catalog.IMAGES)

    def test_a_pin_changes_only_the_images_that_use_it(self, repo):
        before = tags(repo)
        edit_pins(repo, 'deepspeed = "0.19.8"', 'deepspeed = "0.19.7"')
        after = tags(repo)
        assert after["aml-hpc-pytorch"] != before["aml-hpc-pytorch"]
        assert after["aml-hpc-tensorflow"] == before["aml-hpc-tensorflow"]

    def test_a_shared_pin_changes_every_image(self, repo):
        before = tags(repo)
        edit_pins(repo, 'azure_identity = "1.27.0"', 'azure_identity = "1.26.0"')
        after = tags(repo)
        assert all(after[n] != before[n] for n in before)

    def test_base_digest_change(self, repo):
        before = tags(repo)
        edit_pins(repo, 'digest = "sha256:2140e699', 'digest = "sha256:3140e699')
        after = tags(repo)
        assert after["aml-hpc-pytorch"] != before["aml-hpc-pytorch"]
        assert after["aml-hpc-pytorch-arm64"] != before["aml-hpc-pytorch-arm64"]
        assert after["aml-hpc-rocm"] == before["aml-hpc-rocm"]

    def test_unused_infiniband_pins_do_not_rebuild(self, repo):
        """With userspace = "none", the x86-64 DOCA version is in the ROCm image only (it always
        takes DOCA), and the arm64 image takes its own DOCA pin."""
        before = tags(repo)
        edit_pins(repo, 'doca = "3.2.3"', 'doca = "3.2.1"')
        after = tags(repo)
        assert {n for n in before if after[n] != before[n]} == {"aml-hpc-rocm"}
        edit_pins(repo, 'doca_aarch64 = "3.2.2"', 'doca_aarch64 = "3.2.1"')
        assert {n for n in before if tags(repo)[n] != after[n]} == {"aml-hpc-pytorch-arm64"}

    def test_selected_infiniband_layer_changes_tags(self, repo):
        before = tags(repo)
        edit_pins(repo, 'userspace = "none"', 'userspace = "doca"')
        doca = tags(repo)
        switched = {"aml-hpc-pytorch", "aml-hpc-tensorflow"}  # the other two always carry DOCA
        assert {n for n in before if doca[n] != before[n]} == switched
        edit_pins(repo, 'doca = "3.2.3"', 'doca = "3.2.1"')
        assert {n for n in before if tags(repo)[n] != doca[n]} == switched | {"aml-hpc-rocm"}

    def test_a_runtime_change_changes_every_image(self, repo):
        before = tags(repo)
        target = repo / "amlhpc" / "jobs" / "runtime" / "base" / "contract.py"
        target.write_text(target.read_text() + "\n# changed\n")
        after = tags(repo)
        assert all(after[n] != before[n] for n in before)

    def test_a_new_runtime_module_is_picked_up(self, repo):
        before = tags(repo)
        (repo / "amlhpc" / "jobs" / "runtime" / "brand_new.py").write_text('"""new"""\n')
        assert all(tags(repo)[n] != before[n] for n in before)

    def test_a_dockerfile_change_changes_only_that_image(self, repo):
        before = tags(repo)
        dockerfile = repo / "amlhpc" / "images" / "tensorflow" / "Dockerfile"
        dockerfile.write_text(dockerfile.read_text() + "\n# comment\n")
        after = tags(repo)
        assert after["aml-hpc-tensorflow"] != before["aml-hpc-tensorflow"]
        assert after["aml-hpc-pytorch"] == before["aml-hpc-pytorch"]

    def test_executable_bit_counts(self, repo):
        before = tags(repo)
        os.chmod(repo / "amlhpc" / "images" / "common" / "bin" / "install_ib_userspace.sh", 0o644)
        assert all(tags(repo)[n] != before[n] for n in before)

    def test_docs_and_litter_do_not_count(self, repo):
        before = tags(repo)
        (repo / "amlhpc" / "images" / "common" / "nccl-topo" / "README.md").write_text("rewritten")
        (repo / "amlhpc" / "jobs" / "runtime" / "__pycache__").mkdir(exist_ok=True)
        (repo / "amlhpc" / "jobs" / "runtime" / "__pycache__" / "contract.cpython-312.pyc").write_bytes(b"x")
        assert tags(repo) == before

    def test_label_only_args_are_not_hashed(self):
        release = catalog.release(catalog.PYTORCH)
        with_labels = {**release.build_args, "GIT_COMMIT": "abc"}
        assert context.content_hash(release.files, with_labels) != release.tag  # proof the hash sees args
        assert set(catalog.NOT_HASHED_ARGS).isdisjoint(release.build_args)

    def test_moving_bytes_between_files_changes_the_hash(self):
        """Length-prefixed serialization: ("ab","c") and ("a","bc") must not collide."""
        one = {"a": context.ContextFile(b"ab", False), "b": context.ContextFile(b"c", False)}
        two = {"a": context.ContextFile(b"a", False), "b": context.ContextFile(b"bc", False)}
        assert context.content_hash(one, {}) != context.content_hash(two, {})


class TestPurity:
    def test_images_package_imports_no_pulumi_or_azure(self):
        """The build runs without Pulumi or the Azure SDK (az is a command, not an import)."""
        for path in sorted((ROOT / "amlhpc" / "images").glob("*.py")):
            bad = {m for m in imports_of(path) if m.split(".")[0] in ("pulumi", "pulumi_azure_native", "azure")}
            assert not bad, f"{path.name} imports {bad}"

    def test_what_the_pulumi_program_imports_stays_out_of_jobs(self):
        """infra imports amlhpc.images.catalog, and infra never imports jobs (docs/contracts.md 1)."""
        for name in ("catalog.py", "context.py", "pins.py"):
            assert not {m for m in imports_of(ROOT / "amlhpc" / "images" / name) if m.split(".")[0] == "jobs"}, name
        jobs_users = {p.name for p in (ROOT / "amlhpc" / "images").glob("*.py") if any(m.startswith("jobs") for m in imports_of(p))}
        assert jobs_users <= {"stack.py"}

    def test_in_image_scripts_use_only_the_standard_library(self):
        """check_ib_userspace.py and smoke.py run on the base image's bare Python."""
        for path in sorted((ROOT / "amlhpc" / "images" / "common" / "bin").glob("*.py")):
            top = {m.split(".")[0] for m in imports_of(path)}
            assert top <= set(sys.stdlib_module_names) | {"__future__"}, f"{path.name}: {top - set(sys.stdlib_module_names)}"
