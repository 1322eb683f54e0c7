"""Pick the node's fastest local scratch directory for staged data.

In order of preference:

1. `AMLHPC_SCRATCH`, when set: the user (or the local rehearsal) decides; nothing is probed.
2. NVMe: a RAID0 over the node's local NVMe devices (the NDv4 performance article: 8 devices on ND96asr_v4 give
   ~7 TB at ~8 GB/s), mounted at /mnt/resource_nvme. An array that is already assembled
   and mounted (an earlier job, the host image) is reused as is. Otherwise it is built once
   per node, under an exclusive file lock so concurrent callers do not race:
   `mdadm --create /dev/md128 --level 0 --raid-devices N ...`, `mkfs.xfs`, `mount`. A node
   with a single NVMe device gets that device formatted and mounted directly. This needs
   root (or password-less sudo), the `mdadm`/`mkfs.*` tools and the devices visible under
   /dev (a job container sees /sys/block but usually not the device nodes); when any of
   that is missing the reason is recorded in `Scratch.notes` and the next choice is used.
3. The temp disk: /mnt (Azure's local SSD, 2.8 TB on ND96asr_v4), or /mnt/resource.
4. A directory under the system temp dir, as a last resort.

NVMe devices in use are never touched: a device that is mounted, has a mounted partition,
or already belongs to an array is skipped, as are Azure's remote NVMe disks (model
"... NVMe Accelerator ..."), which are managed disks, not local scratch.

Everything is read relative to `root` (sysfs, /dev, /proc/mounts) and every command goes
through `runner`, so tests drive this module with a fake device tree and a runner that
records the commands.

Standard library only: this module ships into the training image.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from amlhpc.jobs.runtime.base.contract import SCRATCH as SCRATCH_VARIABLE

NVME_MOUNT_POINT = "/mnt/resource_nvme"  # the NDv4 performance article's mount point
MD_DEVICE = "/dev/md128"  # the NDv4 performance article's array name
TEMP_DISK_CANDIDATES = ("/mnt", "/mnt/resource")
LOCK_FILE = "amlhpc-scratch.lock"
SUBDIR = "amlhpc"
"""Staged data lives in <scratch mount>/amlhpc, never at the top of a shared mount."""

ScratchKind = Literal["override", "nvme-raid0", "nvme", "temp-disk", "directory"]


class ScratchError(RuntimeError):
    """No usable scratch directory (for example AMLHPC_SCRATCH points at a file)."""


class CommandRunner(Protocol):
    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess: ...


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess:
    """Run a command, capturing its output (the default runner)."""
    return subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=600)


def _is_privileged() -> bool:
    return os.geteuid() == 0


def _sudo_works(runner: CommandRunner, which: Callable[[str], str | None]) -> bool:
    if not which("sudo"):
        return False
    try:
        return runner(["sudo", "-n", "true"]).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@dataclass(frozen=True)
class Scratch:
    """The chosen scratch: stage into `path`."""

    path: Path
    kind: ScratchKind
    detail: str
    """What it is, e.g. '8 NVMe devices as /dev/md128 (RAID0, xfs) at /mnt/resource_nvme'."""
    free_bytes: int | None = None
    notes: tuple[str, ...] = ()
    """Why better choices were not taken; print them, they are how a user finds a lost 5x."""
    commands: tuple[tuple[str, ...], ...] = ()
    """Commands this call ran to build the scratch (empty when it was reused)."""

    def to_json(self) -> dict[str, object]:
        return {"path": str(self.path), "kind": self.kind, "detail": self.detail, "free_bytes": self.free_bytes,
                "notes": list(self.notes), "commands": [list(c) for c in self.commands]}


@dataclass
class Host:
    """The node as this module sees it; tests replace every part."""

    root: Path = Path("/")
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)
    runner: CommandRunner = run_command
    which: Callable[[str], str | None] = shutil.which
    privileged: Callable[[], bool] = _is_privileged
    """True when commands may run without sudo (root)."""
    require_block_devices: bool = True
    """Check /dev entries are block devices (tests use plain files as stand-ins)."""

    def path(self, absolute: str | os.PathLike) -> Path:
        """`absolute` (e.g. /sys/block) under this host's root."""
        return self.root / str(absolute).lstrip("/")


@dataclass(frozen=True)
class NvmeDevice:
    name: str
    size_bytes: int
    model: str


# ------------------------------------------------------------------ reading the node


def mounts(host: Host) -> dict[str, str]:
    """Mount point -> device, from /proc/mounts."""
    table = host.path("/proc/mounts")
    result: dict[str, str] = {}
    try:
        text = table.read_text()
    except OSError:
        return result
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            # /proc/mounts escapes spaces as \040
            result[parts[1].replace("\\040", " ")] = parts[0]
    return result


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def nvme_devices(host: Host) -> tuple[list[NvmeDevice], list[str]]:
    """Local NVMe namespaces that are free to use, and notes on the ones skipped."""
    block = host.path("/sys/block")
    mounted_devices = set(mounts(host).values())
    free: list[NvmeDevice] = []
    notes: list[str] = []
    if not block.is_dir():
        return free, notes
    for entry in sorted(block.iterdir(), key=lambda p: _natural_key(p.name)):
        name = entry.name
        if not name.startswith("nvme"):
            continue
        model = _read(entry / "device" / "model")
        size_bytes = int(_read(entry / "size", "0") or 0) * 512  # sysfs counts 512-byte sectors
        partitions = [p.name for p in entry.iterdir() if p.name.startswith(name + "p")]
        holders = [p.name for p in (entry / "holders").iterdir()] if (entry / "holders").is_dir() else []
        if "accelerator" in model.lower():
            notes.append(f"/dev/{name} ({model}) is a remote managed disk, not local NVMe: skipped")
        elif f"/dev/{name}" in mounted_devices or any(f"/dev/{p}" in mounted_devices for p in partitions):
            notes.append(f"/dev/{name} is mounted (in use): skipped")
        elif holders:
            notes.append(f"/dev/{name} already belongs to {', '.join(holders)}: skipped")
        elif partitions:
            notes.append(f"/dev/{name} has partitions ({', '.join(partitions)}): skipped, it may hold data")
        elif size_bytes == 0:
            notes.append(f"/dev/{name} reports size 0: skipped")
        else:
            free.append(NvmeDevice(name, size_bytes, model))
    return free, notes


def _natural_key(name: str) -> list[object]:
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def mounted_nvme_scratch(host: Host) -> tuple[str, str, int] | None:
    """An already mounted NVMe array or device: (mount point, device, member count), or None."""
    for mount_point, device in sorted(mounts(host).items()):
        if mount_point in ("/", "/boot", "/boot/efi") or not device.startswith("/dev/"):
            continue
        name = device[len("/dev/"):]
        if name.startswith("md"):
            slaves_dir = host.path(f"/sys/block/{name}/slaves")
            slaves = [p.name for p in slaves_dir.iterdir()] if slaves_dir.is_dir() else []
            if slaves and all(s.startswith("nvme") for s in slaves):
                return mount_point, device, len(slaves)
        elif name.startswith("nvme") and "accelerator" not in _read(host.path(f"/sys/block/{name}/device/model")).lower():
            # whole-device mounts only: a partition of an NVMe disk is usually the OS
            if host.path(f"/sys/block/{name}").is_dir():
                return mount_point, device, 1
    return None


def free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


# ------------------------------------------------------------------ building the array


@dataclass
class _Commands:
    host: Host
    sudo: bool
    ran: list[tuple[str, ...]] = field(default_factory=list)

    def run(self, argv: list[str]) -> None:
        full = (["sudo", "-n"] if self.sudo else []) + argv
        self.ran.append(tuple(full))
        try:
            result = self.host.runner(full)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ScratchError(f"`{' '.join(full)}` could not run: {exc}") from None
        if result.returncode != 0:
            output = (result.stderr or result.stdout or "").strip().splitlines()
            tail = output[-1] if output else "no output"
            raise ScratchError(f"`{' '.join(full)}` failed with exit {result.returncode}: {tail}")


def _permission_problem(host: Host, devices: list[NvmeDevice]) -> tuple[str | None, bool]:
    """(why we may not build the array, or None; whether to prefix sudo)."""
    sudo = False
    if not host.privileged():
        if _sudo_works(host.runner, host.which):
            sudo = True
        else:
            return "not root and no password-less sudo", False
    for device in devices:
        node = host.path(f"/dev/{device.name}")
        if not node.exists():
            return (f"/dev/{device.name} is not visible here (a job container sees /sys/block but not the "
                    "device nodes unless it runs privileged)"), sudo
        if host.require_block_devices and not stat.S_ISBLK(node.stat().st_mode):
            return f"/dev/{device.name} is not a block device", sudo
    needed = ["mount", "mkdir", "chmod"] + (["mdadm"] if len(devices) > 1 else [])
    missing = [tool for tool in needed if not host.which(tool)]
    if not (host.which("mkfs.xfs") or host.which("mkfs.ext4")):
        missing.append("mkfs.xfs (or mkfs.ext4)")
    if missing:
        return f"missing tools: {', '.join(missing)} (install mdadm and xfsprogs in the image)", sudo
    return None, sudo


def _build(host: Host, devices: list[NvmeDevice], mount_point: str, md_device: str, sudo: bool) -> list[tuple[str, ...]]:
    commands = _Commands(host, sudo)
    target = md_device if len(devices) > 1 else f"/dev/{devices[0].name}"
    if len(devices) > 1:
        # --run: do not stop to ask when a member carries an old filesystem signature.
        commands.run(["mdadm", "--create", md_device, "--level", "0", "--raid-devices", str(len(devices)), "--run",
                      *(f"/dev/{d.name}" for d in devices)])
    if host.which("mkfs.xfs"):
        commands.run(["mkfs.xfs", "-f", target])
    else:
        commands.run(["mkfs.ext4", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", target])
    commands.run(["mkdir", "-p", mount_point])
    commands.run(["mount", "-o", "noatime", target, mount_point])
    # Training processes may not run as root: let every user write, as /tmp does.
    commands.run(["chmod", "1777", mount_point])
    return commands.ran


class _NodeLock:
    """An exclusive flock on a node-local file, waited for up to `timeout_s`."""

    def __init__(self, path: Path, timeout_s: float):
        self.path = path
        self.timeout_s = timeout_s
        self._fd: int | None = None

    def __enter__(self) -> _NodeLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    os.close(self._fd)
                    raise ScratchError(f"another process held {self.path} for {self.timeout_s:.0f}s while "
                                       "assembling scratch; check for a hung mdadm/mkfs") from None
                time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)


def _lock_path(host: Host) -> Path:
    for candidate in ("/run/lock", "/var/lock"):
        directory = host.path(candidate)
        if directory.is_dir() and os.access(directory, os.W_OK):
            return directory / LOCK_FILE
    return host.path(tempfile.gettempdir()) / LOCK_FILE


# ------------------------------------------------------------------ choosing


_UNSET_HINT = "point it at a writable directory (it is created if missing) or unset it to let staging pick the node's scratch"


def check_writable(path: Path, variable: str, hint: str = _UNSET_HINT) -> Path:
    """`path` as a directory this process can write (created when missing); ScratchError naming
    `variable` when it is a file, below a file, or read-only. A full disk is not bad input:
    OSError(ENOSPC) is raised as is."""
    if path.exists() and not path.is_dir():
        raise ScratchError(f"{variable}: {path} is a file, not a directory; {hint}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".amlhpc-write-test-{os.getpid()}"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except (NotADirectoryError, FileExistsError):
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), path)
        raise ScratchError(f"{variable}: {path} is below {blocker}, which is a file; {hint}") from None
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise ScratchError(f"{variable}: {path} is not writable ({os.strerror(exc.errno).lower()}); {hint}") from None
        raise
    return path


def _usable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def _nvme_scratch(host: Host, notes: list[str], mount_point: str, md_device: str, lock_timeout_s: float) -> Scratch | None:
    existing = mounted_nvme_scratch(host)
    if existing:
        mount, device, members = existing
        what = f"{members} NVMe devices as {device} (RAID0)" if members > 1 else f"NVMe {device}"
        kind: ScratchKind = "nvme-raid0" if members > 1 else "nvme"
        return _scratch_in(host, mount, kind, f"{what} at {mount} (already mounted)", notes)
    devices, skipped = nvme_devices(host)
    notes.extend(skipped)
    if not devices:
        return None
    problem, sudo = _permission_problem(host, devices)
    if problem:
        notes.append(f"{len(devices)} local NVMe device(s) found but not assembled: {problem}; "
                     "using the next best scratch")
        return None
    with _NodeLock(_lock_path(host), lock_timeout_s):
        # Another process may have built it while we waited for the lock.
        existing = mounted_nvme_scratch(host)
        if existing:
            mount, device, members = existing
            kind = "nvme-raid0" if members > 1 else "nvme"
            return _scratch_in(host, mount, kind, f"NVMe {device} at {mount} (assembled by another process)", notes)
        try:
            ran = _build(host, devices, mount_point, md_device, sudo)
        except ScratchError as exc:
            notes.append(f"assembling NVMe scratch failed: {exc}; using the next best scratch")
            return None
    total = sum(d.size_bytes for d in devices)
    fs = "xfs" if host.which("mkfs.xfs") else "ext4"
    if len(devices) > 1:
        detail = f"{len(devices)} NVMe devices as {md_device} (RAID0, {fs}, {total / 1e12:.1f} TB) at {mount_point}"
        kind = "nvme-raid0"
    else:
        detail = f"NVMe /dev/{devices[0].name} ({fs}, {total / 1e12:.1f} TB) at {mount_point}"
        kind = "nvme"
    return _scratch_in(host, mount_point, kind, detail, notes, tuple(ran))


def _scratch_in(host: Host, mount: str, kind: ScratchKind, detail: str, notes: list[str],
                commands: tuple[tuple[str, ...], ...] = ()) -> Scratch:
    """Scratch in <mount>/amlhpc; `mount` is an absolute path on the node (mapped under host.root)."""
    path = host.path(mount) / SUBDIR
    path.mkdir(parents=True, exist_ok=True)
    return Scratch(path, kind, detail, free_bytes(path), tuple(notes), commands)


def pick_scratch(host: Host | None = None, *, required_bytes: int = 0, resume_markers: Sequence[str] = (),
                 mount_point: str = NVME_MOUNT_POINT, md_device: str = MD_DEVICE, lock_timeout_s: float = 900.0) -> Scratch:
    """The fastest usable scratch on this node (see the module docstring).

    required_bytes: skip candidates with less free space than this (0: no check); the
        override is never skipped, only noted.
    resume_markers: paths below the scratch directory that an earlier run leaves (staging's
        manifests). A candidate holding one is kept whatever its free space: the bytes
        already there count towards what is needed, and moving elsewhere would download
        everything again.
    """
    host = host or Host()
    notes: list[str] = []
    override = host.env.get(SCRATCH_VARIABLE, "").strip()
    if override:
        path = check_writable(Path(override), SCRATCH_VARIABLE)
        free = free_bytes(path)
        if required_bytes and free is not None and free < required_bytes:
            notes.append(f"{override} has {free / 1e9:.1f} GB free, staging needs {required_bytes / 1e9:.1f} GB")
        return Scratch(path, "override", f"{SCRATCH_VARIABLE}={override}", free, tuple(notes))

    def fits(scratch_dir: Path, free: int | None) -> bool:
        if not required_bytes or free is None or free >= required_bytes:
            return True
        return any((scratch_dir / marker).exists() for marker in resume_markers)

    nvme = _nvme_scratch(host, notes, mount_point, md_device, lock_timeout_s)
    if nvme and fits(nvme.path, nvme.free_bytes):
        return nvme
    if nvme and nvme.free_bytes is not None:  # unknown free space always fits
        notes.append(f"{nvme.detail} has {nvme.free_bytes / 1e9:.1f} GB free, staging needs {required_bytes / 1e9:.1f} GB")

    for candidate in TEMP_DISK_CANDIDATES:
        directory = host.path(candidate)
        if not _usable_dir(directory):
            continue
        free = free_bytes(directory)
        if free is not None and not fits(directory / SUBDIR, free):  # unknown free space always fits
            notes.append(f"temp disk {candidate} has {free / 1e9:.1f} GB free, staging needs {required_bytes / 1e9:.1f} GB")
            continue
        return _scratch_in(host, candidate, "temp-disk", f"temp disk {candidate}", notes)

    fallback = tempfile.gettempdir()
    notes.append(f"no NVMe or temp disk usable: staging into {fallback}, which may be small and slow")
    return _scratch_in(host, fallback, "directory", f"directory {fallback}", notes)
