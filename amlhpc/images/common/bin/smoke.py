#!/usr/bin/env python3
"""Smoke test run inside a built training image (installed as `aml-hpc-smoke`).

Reports, in this order: Python; the framework (torch or tensorflow: version, CUDA, GPUs
seen, DeepSpeed / Horovod when present); NCCL's version (ncclGetVersion, no GPU needed);
`ibv_devinfo` (HCAs and port states); `ompi_info --version`; `ucx_info -v`; then the job
runtime's own gate, `python -m amlhpc.jobs.runtime.health --quick`. Prints a table and, with
--json, writes every result to a file (bench/RESULTS.md quotes it).

On a machine without GPUs or InfiniBand (a build host) the missing hardware is a warning;
on a GPU node pass --expect-gpu and --expect-ib so their absence fails the smoke.
Exit status: 0 everything required passed, 1 something required failed.
Standard library only.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Result:
    name: str
    status: str
    """ok, warn (reported, not fatal) or fail."""
    detail: str


def _run(argv: list[str], timeout: int = 300) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


def check_python() -> Result:
    return Result("python", "ok", f"{platform.python_version()} ({sys.executable})")


def check_framework(expect_gpu: bool) -> list[Result]:
    results: list[Result] = []
    found = False
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        torch = None
    if torch is not None:
        found = True
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        nccl = ""
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - CPU builds have no NCCL; reported below
            nccl = "none"
        results.append(Result("torch", "ok", f"{torch.__version__} cuda={torch.version.cuda} nccl={nccl}"))
        results.append(_gpus(gpus, expect_gpu))
        try:
            deepspeed = importlib.import_module("deepspeed")
            results.append(Result("deepspeed", "ok", deepspeed.__version__))
        except ImportError:
            pass
    try:
        tf = importlib.import_module("tensorflow")
    except ImportError:
        tf = None
    if tf is not None:
        found = True
        info = tf.sysconfig.get_build_info()
        gpus = len(tf.config.list_physical_devices("GPU"))
        results.append(Result("tensorflow", "ok", f"{tf.__version__} cuda={info.get('cuda_version', '?')} cudnn={info.get('cudnn_version', '?')}"))
        results.append(_gpus(gpus, expect_gpu))
        try:
            hvd = importlib.import_module("horovod.tensorflow")
            built = f"nccl={hvd.nccl_built()} mpi={hvd.mpi_built()}"
            results.append(Result("horovod", "ok" if hvd.nccl_built() and hvd.mpi_built() else "fail",
                                  f"{importlib.import_module('horovod').__version__} {built}"))
        except ImportError as exc:
            results.append(Result("horovod", "fail", f"not importable: {exc}"))
    if not found:
        results.append(Result("framework", "fail", "neither torch nor tensorflow imports"))
    return results


def _gpus(count: int, expect_gpu: bool) -> Result:
    if count:
        return Result("gpus", "ok", f"{count} visible")
    return Result("gpus", "fail" if expect_gpu else "warn", "no GPU visible to the framework")


def check_nccl() -> Result:
    name = ctypes.util.find_library("nccl") or "libnccl.so.2"
    try:
        lib = ctypes.CDLL(name)
        code = ctypes.c_int(0)
        if lib.ncclGetVersion(ctypes.byref(code)) != 0:
            return Result("nccl", "fail", f"{name}: ncclGetVersion failed")
    except (OSError, AttributeError) as exc:
        return Result("nccl", "fail", f"libnccl not loadable: {exc}")
    value = code.value
    major, rest = divmod(value, 10000) if value >= 10000 else divmod(value, 1000)
    minor, patch = divmod(rest, 100)
    return Result("nccl", "ok", f"{major}.{minor}.{patch} ({name})")


def check_ibv_devinfo(expect_ib: bool) -> Result:
    if shutil.which("ibv_devinfo") is None:
        return Result("ibv_devinfo", "fail" if expect_ib else "warn", "not installed")
    code, out = _run(["ibv_devinfo"])
    hcas = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("hca_id:")]
    active = sum(1 for line in out.splitlines() if "PORT_ACTIVE" in line)
    if code == 0 and hcas:
        return Result("ibv_devinfo", "ok", f"{len(hcas)} HCAs ({', '.join(hcas)}), {active} ports active")
    return Result("ibv_devinfo", "fail" if expect_ib else "warn", (out.splitlines() or ["no output"])[0] + f" (exit {code})")


def check_tool(name: str, argv: list[str], required: bool) -> Result:
    if shutil.which(argv[0]) is None:
        return Result(name, "fail" if required else "warn", f"{argv[0]} not on PATH")
    code, out = _run(argv)
    first = out.splitlines()[0] if out else "no output"
    return Result(name, "ok" if code == 0 else ("fail" if required else "warn"), f"{first} (exit {code})" if code else first)


def check_health(expect_gpu: bool, report_dir: Path) -> Result:
    """The runtime's own health CLI: gate mode on GPU nodes, report mode elsewhere."""
    mode = "gate" if expect_gpu else "report"
    code, out = _run([sys.executable, "-m", "amlhpc.jobs.runtime.health", "--quick", "--mode", mode,
                      "--report-dir", str(report_dir)], timeout=900)
    tail = " | ".join(out.splitlines()[-3:]) if out else "no output"
    return Result("runtime health --quick", "ok" if code == 0 else "fail", f"mode={mode} exit {code}: {tail}")


def run(expect_gpu: bool, expect_ib: bool, skip_health: bool, report_dir: Path) -> list[Result]:
    results = [check_python(), *check_framework(expect_gpu), check_nccl(), check_ibv_devinfo(expect_ib),
               check_tool("ompi_info", ["ompi_info", "--version"], required=True),
               check_tool("ucx_info", ["ucx_info", "-v"], required=False)]
    if not skip_health:
        results.append(check_health(expect_gpu, report_dir))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aml-hpc-smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--expect-gpu", action="store_true", help="fail when no GPU is visible (run on GPU nodes)")
    parser.add_argument("--expect-ib", action="store_true", help="fail when ibv_devinfo finds no HCA (run on IB nodes)")
    parser.add_argument("--skip-health", action="store_true", help="do not run python -m amlhpc.jobs.runtime.health --quick")
    parser.add_argument("--json", dest="json_path", help="write all results as JSON here")
    parser.add_argument("--report-dir", default=None, help="where the health check writes its per-node report")
    args = parser.parse_args(argv)
    report_dir = Path(args.report_dir or tempfile.mkdtemp(prefix="aml-hpc-smoke-"))
    results = run(args.expect_gpu, args.expect_ib, args.skip_health, report_dir)
    width = max(len(r.name) for r in results)
    image = os.environ.get("AMLHPC_IMAGE", "unknown image")
    print(f"aml-hpc smoke: {image} {os.environ.get('AMLHPC_IMAGE_VERSION', '')}".rstrip())
    for r in results:
        print(f"  {r.status.upper():<4}  {r.name:<{width}}  {r.detail}")
    failed = [r.name for r in results if r.status == "fail"]
    print("result: " + ("FAILED (" + ", ".join(failed) + ")" if failed else "passed"))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"image": image, "passed": not failed,
                                                    "results": [asdict(r) for r in results]}, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
