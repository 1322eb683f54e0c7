"""amlhpc.jobs.runtime.node.scratch: pick NVMe RAID0 > temp disk > directory, on a fake device tree.

The fake node is a directory holding sys/block/nvme*, dev/ stand-ins and proc/mounts; the
fake runner records every command and plays its effect on the tree (mdadm creates the
array's sysfs entry, mount adds a /proc/mounts line), so a second call sees what the first
one built.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from amlhpc.jobs.runtime.node import scratch
from amlhpc.jobs.runtime.node.scratch import Host, ScratchError, pick_scratch

TOOLS = {"mdadm", "mkfs.xfs", "mount", "mkdir", "chmod", "sudo"}


class FakeNode:
    def __init__(self, root: Path, nvme: int = 8, size_gib: int = 894, model: str = "Microsoft NVMe Direct Disk"):
        self.root = root
        self.commands: list[tuple[str, ...]] = []
        self.fail: str | None = None
        self.lock = threading.Lock()
        (root / "proc").mkdir(parents=True)
        (root / "proc" / "mounts").write_text("/dev/sda1 / ext4 rw 0 0\n/dev/sdb1 /mnt ext4 rw 0 0\n")
        (root / "dev").mkdir()
        (root / "mnt").mkdir()
        (root / "tmp").mkdir()
        for i in range(nvme):
            self.add_nvme(f"nvme{i}n1", size_gib, model)

    def add_nvme(self, name: str, size_gib: int = 894, model: str = "Microsoft NVMe Direct Disk") -> Path:
        device = self.root / "sys" / "block" / name
        (device / "device").mkdir(parents=True)
        (device / "holders").mkdir()
        (device / "size").write_text(str(size_gib * (1 << 30) // 512))
        (device / "device" / "model").write_text(model + "\n")
        (self.root / "dev" / name).write_text("")
        return device

    def mount_line(self, device: str, mount_point: str, fstype: str = "xfs") -> None:
        with open(self.root / "proc" / "mounts", "a") as f:
            f.write(f"{device} {mount_point} {fstype} rw 0 0\n")

    def runner(self, argv):
        argv = tuple(argv)
        with self.lock:
            self.commands.append(argv)
        cmd = argv[2:] if argv[:2] == ("sudo", "-n") else argv
        if cmd == ("true",):
            return subprocess.CompletedProcess(argv, 0, "", "")
        if self.fail and cmd[0] == self.fail:
            return subprocess.CompletedProcess(argv, 1, "", f"{self.fail}: device busy\n")
        if cmd[0] == "mdadm":
            md = cmd[2].split("/")[-1]
            slaves = self.root / "sys" / "block" / md / "slaves"
            slaves.mkdir(parents=True)
            for dev in cmd[8:]:
                (slaves / dev.split("/")[-1]).mkdir()
        elif cmd[0] == "mkdir":
            (self.root / cmd[-1].lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif cmd[0] == "mount":
            self.mount_line(cmd[-2], cmd[-1])
        return subprocess.CompletedProcess(argv, 0, "", "")

    def host(self, *, privileged: bool = True, tools: set[str] = TOOLS, env: dict | None = None) -> Host:
        return Host(root=self.root, env=env or {}, runner=self.runner,
                    which=lambda name: f"/usr/sbin/{name}" if name in tools else None,
                    privileged=lambda: privileged, require_block_devices=False)

    def ran(self) -> list[tuple[str, ...]]:
        return [c for c in self.commands if c[-1] != "true"]


@pytest.fixture
def node(tmp_path):
    return FakeNode(tmp_path / "node")


class TestNvmeRaid:
    def test_eight_devices_become_one_raid0_as_in_seed_003(self, node):
        picked = pick_scratch(node.host())
        assert picked.kind == "nvme-raid0"
        assert picked.path == node.root / "mnt" / "resource_nvme" / "amlhpc"
        assert picked.path.is_dir()
        devices = tuple(f"/dev/nvme{i}n1" for i in range(8))
        assert node.ran() == [
            ("mdadm", "--create", "/dev/md128", "--level", "0", "--raid-devices", "8", "--run", *devices),
            ("mkfs.xfs", "-f", "/dev/md128"),
            ("mkdir", "-p", "/mnt/resource_nvme"),
            ("mount", "-o", "noatime", "/dev/md128", "/mnt/resource_nvme"),
            ("chmod", "1777", "/mnt/resource_nvme"),
        ]
        assert "8 NVMe devices as /dev/md128 (RAID0, xfs" in picked.detail
        assert picked.commands == tuple(node.ran())

    def test_devices_in_natural_order(self, tmp_path):
        node = FakeNode(tmp_path / "n", nvme=0)
        for i in (10, 2, 1, 0):
            node.add_nvme(f"nvme{i}n1")
        pick_scratch(node.host())
        assert node.ran()[0][-4:] == ("/dev/nvme0n1", "/dev/nvme1n1", "/dev/nvme2n1", "/dev/nvme10n1")

    def test_second_call_reuses_the_array(self, node):
        pick_scratch(node.host())
        first = len(node.commands)
        again = pick_scratch(node.host())
        assert len(node.commands) == first
        assert again.kind == "nvme-raid0" and "already mounted" in again.detail

    def test_array_built_once_under_concurrency(self, node):
        """Two processes of the node racing: the lock lets one build, the other reuses."""
        results = []
        threads = [threading.Thread(target=lambda: results.append(pick_scratch(node.host()))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(1 for c in node.commands if c[0] == "mdadm") == 1
        assert {r.kind for r in results} == {"nvme-raid0"}

    def test_sudo_prefix_when_not_root(self, node):
        picked = pick_scratch(node.host(privileged=False))
        assert picked.kind == "nvme-raid0"
        assert all(c[:2] == ("sudo", "-n") for c in node.commands)

    def test_single_device_is_formatted_without_mdadm(self, tmp_path):
        node = FakeNode(tmp_path / "n", nvme=1)
        picked = pick_scratch(node.host())
        assert picked.kind == "nvme"
        assert [c[0] for c in node.ran()] == ["mkfs.xfs", "mkdir", "mount", "chmod"]
        assert node.ran()[0] == ("mkfs.xfs", "-f", "/dev/nvme0n1")

    def test_ext4_when_xfs_tools_are_missing(self, node):
        pick_scratch(node.host(tools=TOOLS - {"mkfs.xfs"} | {"mkfs.ext4"}))
        assert node.ran()[1][:2] == ("mkfs.ext4", "-F")


class TestDevicesInUseAreNeverTouched:
    def test_mounted_partitioned_member_and_remote_disks_are_skipped(self, tmp_path):
        node = FakeNode(tmp_path / "n", nvme=4)
        (node.root / "sys/block/nvme0n1/nvme0n1p1").mkdir()  # an NVMe OS disk
        node.mount_line("/dev/nvme0n1p1", "/boot/efi", "vfat")
        (node.root / "sys/block/nvme1n1/nvme1n1p1").mkdir()
        (node.root / "sys/block/nvme2n1/holders/md0").mkdir()
        node.add_nvme("nvme9n1", model="MSFT NVMe Accelerator v1.0")
        picked = pick_scratch(node.host())
        # only nvme3n1 is free: formatted alone
        assert picked.kind == "nvme"
        assert node.ran()[0] == ("mkfs.xfs", "-f", "/dev/nvme3n1")
        notes = " ".join(picked.notes)
        assert "/dev/nvme0n1 is mounted (in use)" in notes
        assert "/dev/nvme1n1 has partitions" in notes
        assert "/dev/nvme2n1 already belongs to md0" in notes
        assert "remote managed disk" in notes

    def test_single_device_mounted_by_the_image_is_reused(self, tmp_path):
        node = FakeNode(tmp_path / "n", nvme=1)
        node.mount_line("/dev/nvme0n1", "/mnt/local_nvme")
        picked = pick_scratch(node.host())
        assert (picked.kind, picked.path) == ("nvme", node.root / "mnt" / "local_nvme" / "amlhpc")
        assert node.ran() == []

    def test_array_mounted_by_the_image_is_reused(self, node):
        slaves = node.root / "sys/block/md0/slaves"
        for i in range(8):
            (slaves / f"nvme{i}n1").mkdir(parents=True)
            (node.root / f"sys/block/nvme{i}n1/holders/md0").mkdir()
        node.mount_line("/dev/md0", "/mnt/nvme")
        picked = pick_scratch(node.host())
        assert picked.kind == "nvme-raid0"
        assert picked.path == node.root / "mnt" / "nvme" / "amlhpc"
        assert node.ran() == []


class TestFallbacks:
    def test_not_permitted_falls_back_to_temp_disk_with_reason(self, node):
        picked = pick_scratch(node.host(privileged=False, tools=TOOLS - {"sudo"}))
        assert picked.kind == "temp-disk"
        assert picked.path == node.root / "mnt" / "amlhpc"
        assert any("8 local NVMe device(s) found but not assembled: not root and no password-less sudo" in n
                   for n in picked.notes)
        assert node.ran() == []

    def test_device_nodes_hidden_in_container(self, node):
        for dev in (node.root / "dev").iterdir():
            dev.unlink()
        picked = pick_scratch(node.host())
        assert picked.kind == "temp-disk"
        assert any("is not visible here" in n and "privileged" in n for n in picked.notes)

    def test_missing_mdadm(self, node):
        picked = pick_scratch(node.host(tools=TOOLS - {"mdadm"}))
        assert picked.kind == "temp-disk"
        assert any("missing tools: mdadm" in n for n in picked.notes)

    def test_failing_command_is_reported_and_next_best_used(self, node):
        node.fail = "mkfs.xfs"
        picked = pick_scratch(node.host())
        assert picked.kind == "temp-disk"
        assert any("`mkfs.xfs -f /dev/md128` failed with exit 1: mkfs.xfs: device busy" in n for n in picked.notes)

    def test_no_nvme_uses_temp_disk(self, tmp_path):
        node = FakeNode(tmp_path / "n", nvme=0)
        picked = pick_scratch(node.host())
        assert (picked.kind, picked.notes) == ("temp-disk", ())

    def test_too_small_temp_disk_falls_back_to_a_directory(self, tmp_path):
        node = FakeNode(tmp_path / "n", nvme=0)
        picked = pick_scratch(node.host(), required_bytes=1 << 62)
        assert picked.kind == "directory"
        assert any("temp disk /mnt has" in n and "staging needs" in n for n in picked.notes)


    def test_a_scratch_with_an_earlier_run_is_kept_however_full(self, tmp_path):
        """Resuming: the bytes already staged count, so a 'too small' disk holding them is not abandoned."""
        node = FakeNode(tmp_path / "n", nvme=0)
        (node.root / "mnt" / "amlhpc" / ".amlhpc-staging" / "cosmo").mkdir(parents=True)
        picked = pick_scratch(node.host(), required_bytes=1 << 62, resume_markers=[".amlhpc-staging/cosmo"])
        assert picked.kind == "temp-disk"
        other = pick_scratch(node.host(), required_bytes=1 << 62, resume_markers=[".amlhpc-staging/other"])
        assert other.kind == "directory"


class TestOverride:
    def test_env_wins_and_probes_nothing(self, node, tmp_path):
        target = tmp_path / "forced"
        picked = pick_scratch(node.host(env={scratch.SCRATCH_VARIABLE: str(target)}))
        assert (picked.kind, picked.path) == ("override", target)
        assert target.is_dir()
        assert node.commands == []

    def test_env_pointing_at_a_file_is_an_error(self, node, tmp_path):
        bad = tmp_path / "file"
        bad.write_text("x")
        with pytest.raises(ScratchError, match=r"AMLHPC_SCRATCH: .*file is a file, not a directory.*unset it"):
            pick_scratch(node.host(env={scratch.SCRATCH_VARIABLE: str(bad)}))

    def test_env_below_a_file_is_an_error(self, node, tmp_path):
        bad = tmp_path / "file"
        bad.write_text("x")
        with pytest.raises(ScratchError, match=rf"AMLHPC_SCRATCH: {bad}/sub is below {bad}, which is a file"):
            pick_scratch(node.host(env={scratch.SCRATCH_VARIABLE: str(bad / "sub")}))

    def test_to_json(self, node):
        doc = pick_scratch(node.host()).to_json()
        assert doc["kind"] == "nvme-raid0" and doc["commands"][0][0] == "mdadm"
