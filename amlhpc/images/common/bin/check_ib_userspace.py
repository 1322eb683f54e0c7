#!/usr/bin/env python3
"""Build-time check: fail the image build unless the InfiniBand user space is complete.

Runs in a Dockerfile RUN step (installed as `aml-hpc-check-ib`). Without these pieces a
multi-node job does not fail - NCCL silently falls back to TCP sockets and runs several
times slower - so the build is where to catch them:

  libibverbs       libibverbs.so.1                       (rdma-core / DOCA-OFED / MLNX_OFED)
  mlx5 provider    libmlx5.so.1 and libibverbs/libmlx5-rdmav*.so (the ConnectX driver plugin)
  HPC-X/OpenMPI    ompi_info that runs and reports Open MPI
  NCCL             libnccl.so.2 (NVIDIA images; --gpu-vendor amd checks RCCL's librccl.so.1,
                   whose InfiniBand transport is built in, instead)
  NCCL net plugin  libnccl-net*.so from the RDMA/SHARP plugin (not the AWS OFI one; NVIDIA only)
  ofed_info        only when DOCA-OFED or MLNX_OFED was added (and its version for MLNX_OFED)

Warnings only (reported, never fatal): librdmacm, UCX's ucx_info, ibv_devinfo (the smoke
command uses it), the mlx5 .driver file; and OpenMPI in the ROCm image (RCCL jobs start with
torch.distributed, not mpirun). Writes what it found as JSON (--report).
Standard library only; `--root` points it at a fake tree for tests.
Exit status: 0 all required pieces present, 1 something required is missing, 2 bad usage.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_LIB_DIRS = (
    "/usr/local/lib", "/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
    "/lib/aarch64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib", "/lib",
)
MPI_BIN_DIRS = ("/opt/hpcx/ompi/bin", "/usr/local/mpi/bin", "/usr/mpi/gcc/openmpi/bin")
PLUGIN_DIRS = (
    "/opt/hpcx/nccl_rdma_sharp_plugin/lib",           # HPC-X (NGC images)
    "/usr/local/nccl-rdma-sharp-plugins/lib",         # Azure HPC VM images
    "/opt/mellanox/nccl-rdma-sharp-plugins/lib",
)
DRIVER_CONF_DIRS = ("/etc/libibverbs.d", "/usr/local/etc/libibverbs.d")
FIX_BASE = ("the base image no longer carries it: pick a base that does (amlhpc/images/pins.toml), or set "
            "[infiniband].userspace = \"doca\" to add DOCA-OFED user space")


@dataclass
class Finding:
    name: str
    ok: bool
    required: bool
    detail: str
    fix: str = ""


@dataclass
class Report:
    expect: str
    findings: list[Finding] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def missing(self) -> list[Finding]:
        return [f for f in self.findings if f.required and not f.ok]

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)


class Tree:
    """The filesystem the check looks at: `/` in the image, a fake tree in tests."""

    def __init__(self, root: str, env: dict[str, str]):
        self.root = root.rstrip("/") or "/"
        self.env = env

    def path(self, absolute: str) -> str:
        return absolute if self.root == "/" else self.root + absolute

    def strip(self, real: str) -> str:
        return real if self.root == "/" else real[len(self.root):] or "/"

    def lib_dirs(self) -> list[str]:
        dirs: list[str] = [d for d in self.env.get("LD_LIBRARY_PATH", "").split(":") if d]
        dirs += self._ld_conf("/etc/ld.so.conf", depth=0)
        dirs += list(DEFAULT_LIB_DIRS)
        seen: list[str] = []
        for d in dirs:
            if d not in seen and os.path.isdir(self.path(d)):
                seen.append(d)
        return seen

    def _ld_conf(self, conf: str, depth: int) -> list[str]:
        if depth > 4 or not os.path.isfile(self.path(conf)):
            return []
        found: list[str] = []
        with open(self.path(conf), encoding="utf-8", errors="replace") as handle:
            for raw in handle:
                line = raw.split("#", 1)[0].strip()
                if not line:
                    continue
                if line.startswith("include "):
                    pattern = line.split(None, 1)[1]
                    if not pattern.startswith("/"):
                        pattern = os.path.join(os.path.dirname(conf), pattern)
                    for inc in sorted(glob.glob(self.path(pattern))):
                        found += self._ld_conf(self.strip(inc), depth + 1)
                else:
                    found.append(line)
        return found

    def find(self, dirs: list[str] | tuple[str, ...], pattern: str) -> list[str]:
        hits: list[str] = []
        for d in dirs:
            for real in sorted(glob.glob(os.path.join(self.path(d), pattern))):
                path = self.strip(real)
                if path not in hits:
                    hits.append(path)
        return hits

    def which(self, name: str, extra: tuple[str, ...] = ()) -> str | None:
        for d in [p for p in self.env.get("PATH", "").split(":") if p] + list(extra):
            candidate = self.path(os.path.join(d, name))
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return self.strip(candidate)
        return None

    def run(self, command: list[str]) -> tuple[int, str]:
        argv = [self.path(command[0]), *command[1:]]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=self.env, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 127, str(exc)
        return done.returncode, (done.stdout + done.stderr).strip()


def check_verbs(tree: Tree, report: Report) -> None:
    libdirs = tree.lib_dirs()
    verbs = tree.find(libdirs, "libibverbs.so.1")
    report.add(Finding("libibverbs", bool(verbs), True, verbs[0] if verbs else "libibverbs.so.1 not found in " + ":".join(libdirs), FIX_BASE))

    mlx5 = tree.find(libdirs, "libmlx5.so.1")
    providers = tree.find([os.path.join(d, "libibverbs") for d in libdirs], "libmlx5-rdmav*.so")
    ok = bool(mlx5) and bool(providers)
    detail = ", ".join(mlx5 + providers) if ok else (
        ("libmlx5.so.1 found" if mlx5 else "libmlx5.so.1 missing") + "; "
        + ("provider plugin found" if providers else "libibverbs/libmlx5-rdmav*.so missing"))
    report.add(Finding("mlx5 provider", ok, True, detail, FIX_BASE))

    driver = tree.find(DRIVER_CONF_DIRS, "mlx5.driver")
    report.add(Finding("mlx5 .driver file", bool(driver), False,
                       driver[0] if driver else "no mlx5.driver under " + " or ".join(DRIVER_CONF_DIRS) + " (needed by libibverbs built with a config dir)"))

    rdmacm = tree.find(libdirs, "librdmacm.so.1")
    report.add(Finding("librdmacm", bool(rdmacm), False, rdmacm[0] if rdmacm else "librdmacm.so.1 not found (UCX rdmacm transport unavailable)"))


def check_mpi(tree: Tree, report: Report) -> None:
    ompi_info = tree.which("ompi_info", MPI_BIN_DIRS)
    if ompi_info is None:
        report.add(Finding("HPC-X/OpenMPI", False, True, "ompi_info not found on PATH or in " + ", ".join(MPI_BIN_DIRS), FIX_BASE))
    else:
        code, out = tree.run([ompi_info, "--version"])
        first = out.splitlines()[0] if out else ""
        ok = code == 0 and "Open MPI" in out
        report.add(Finding("HPC-X/OpenMPI", ok, True, f"{ompi_info}: {first or 'no output'} (exit {code})",
                           "" if ok else "ompi_info exists but does not run: a library it links is missing (ldd " + ompi_info + ")"))
        if ok:
            report.versions["openmpi"] = first
    hpcx = tree.env.get("HPCX_DIR") or ("/opt/hpcx" if os.path.isdir(tree.path("/opt/hpcx")) else "")
    if hpcx:
        report.versions["hpcx_dir"] = hpcx
    ucx_info = tree.which("ucx_info", ("/opt/hpcx/ucx/bin",))
    if ucx_info:
        code, out = tree.run([ucx_info, "-v"])
        report.add(Finding("UCX", code == 0, False, f"{ucx_info}: {out.splitlines()[0] if out else ''}"))
        if code == 0 and out:
            report.versions["ucx"] = out.splitlines()[0]
    else:
        report.add(Finding("UCX", False, False, "ucx_info not found (HPC-X normally provides it)"))


def check_nccl(tree: Tree, report: Report) -> None:
    libdirs = tree.lib_dirs()
    nccl = tree.find(libdirs, "libnccl.so.2*")
    report.add(Finding("NCCL", bool(nccl), True, nccl[0] if nccl else "libnccl.so.2 not found", FIX_BASE))
    if nccl and tree.root == "/":
        version = nccl_version(nccl[0])
        if version:
            report.versions["nccl"] = version

    plugin_dirs = list(PLUGIN_DIRS)
    extra = tree.env.get("HPCX_NCCL_RDMA_SHARP_PLUGIN_DIR")
    if extra:
        plugin_dirs.insert(0, os.path.join(extra, "lib"))
    candidates = tree.find(plugin_dirs + libdirs, "libnccl-net*.so*")
    # The AWS OFI plugin (libfabric/EFA) ships in NGC images too; it does nothing on Azure.
    plugins = [p for p in candidates if "ofi" not in os.path.basename(p) and "aws-ofi" not in p and "/amazon/" not in p]
    report.add(Finding("NCCL net plugin", bool(plugins), True,
                       ", ".join(plugins) if plugins else "no libnccl-net*.so from the RDMA/SHARP plugin in " + ", ".join(plugin_dirs) + " or the library path"
                       + (f" (ignored: {', '.join(candidates)})" if candidates else ""),
                       FIX_BASE))


ROCM_LIB_DIRS = ("/opt/rocm/lib", "/opt/rocm/lib64")


def check_rccl(tree: Tree, report: Report) -> None:
    rccl = tree.find(list(ROCM_LIB_DIRS) + tree.lib_dirs(), "librccl.so.1*")
    report.add(Finding("RCCL", bool(rccl), True, rccl[0] if rccl else "librccl.so.1 not found in /opt/rocm/lib",
                       "the ROCm base no longer carries RCCL: pick a rocm/pytorch tag that does (amlhpc/images/pins.toml)"))


def nccl_version(library: str) -> str:
    """NCCL's own version via ncclGetVersion (needs no GPU), e.g. 2.27.7."""
    try:
        lib = ctypes.CDLL(library)
        code = ctypes.c_int(0)
        if lib.ncclGetVersion(ctypes.byref(code)) != 0:
            return ""
    except (OSError, AttributeError):
        return ""
    value = code.value
    major, rest = divmod(value, 10000) if value >= 10000 else divmod(value, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def check_tools(tree: Tree, report: Report, expect: str, mlnx_ofed_version: str) -> None:
    devinfo = tree.which("ibv_devinfo")
    report.add(Finding("ibv_devinfo", bool(devinfo), False, devinfo or "ibv_devinfo not on PATH (smoke cannot list HCAs)"))
    if expect == "none":
        return
    ofed_info = tree.which("ofed_info")
    if ofed_info is None:
        report.add(Finding("ofed_info", False, True, f"IB user space {expect!r} was requested but ofed_info is missing",
                           "the DOCA-OFED / MLNX_OFED install step did not complete; read its log above"))
        return
    code, out = tree.run([ofed_info, "-s"])
    line = out.splitlines()[0] if out else ""
    report.versions["ofed"] = line.rstrip(":")
    if expect == "mlnx-ofed":
        ok = code == 0 and mlnx_ofed_version in line
        report.add(Finding("ofed_info", ok, True, f"{line or 'no output'} (expected {mlnx_ofed_version})",
                           "" if ok else "MLNX_OFED reports another version than amlhpc/images/pins.toml pins"))
    else:
        report.add(Finding("ofed_info", code == 0, True, line or "no output"))


def run_checks(root: str, env: dict[str, str], expect: str, mlnx_ofed_version: str = "",
               gpu_vendor: str = "nvidia") -> Report:
    tree = Tree(root, env)
    report = Report(expect)
    check_verbs(tree, report)
    if gpu_vendor == "amd":
        mpi = Report(expect)
        check_mpi(tree, mpi)
        for finding in mpi.findings:
            finding.required = False
            report.add(finding)
        report.versions.update(mpi.versions)
        check_rccl(tree, report)
    else:
        check_mpi(tree, report)
        check_nccl(tree, report)
    check_tools(tree, report, expect, mlnx_ofed_version)
    return report


def render(report: Report) -> str:
    lines = [f"InfiniBand user space check (userspace={report.expect})"]
    for f in report.findings:
        mark = "ok  " if f.ok else ("FAIL" if f.required else "warn")
        lines.append(f"  [{mark}] {f.name}: {f.detail}")
    for key, value in sorted(report.versions.items()):
        lines.append(f"  version {key}: {value}")
    if report.missing:
        lines.append("missing: " + ", ".join(f.name for f in report.missing))
        fixes = sorted({f.fix for f in report.missing if f.fix})
        lines += [f"  fix: {fix}" for fix in fixes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aml-hpc-check-ib", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/", help="filesystem root to inspect (tests use a fake tree)")
    parser.add_argument("--expect", default=os.environ.get("IB_USERSPACE", "none"), choices=("none", "doca", "mlnx-ofed"),
                        help="which user space the build installed (default: $IB_USERSPACE or none)")
    parser.add_argument("--mlnx-ofed-version", default=os.environ.get("MLNX_OFED_VERSION", ""))
    parser.add_argument("--gpu-vendor", default="nvidia", choices=("nvidia", "amd"),
                        help="nvidia: NCCL and its RDMA plugin; amd: RCCL (default nvidia)")
    parser.add_argument("--report", help="write the findings as JSON here")
    args = parser.parse_args(argv)
    if args.expect == "mlnx-ofed" and not args.mlnx_ofed_version:
        parser.error("--expect mlnx-ofed needs --mlnx-ofed-version (or MLNX_OFED_VERSION)")
    report = run_checks(args.root, dict(os.environ), args.expect, args.mlnx_ofed_version, args.gpu_vendor)
    print(render(report))
    if args.report:
        out = Path(args.report)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"expect": report.expect, "ok": not report.missing,
                                   "findings": [asdict(f) for f in report.findings],
                                   "versions": report.versions}, indent=2) + "\n", encoding="utf-8")
    return 1 if report.missing else 0


if __name__ == "__main__":
    sys.exit(main())
