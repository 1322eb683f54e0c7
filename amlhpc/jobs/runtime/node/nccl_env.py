"""Adapt the job's NCCL/UCX settings to the node it runs on, before anything starts.

The job builder sets Azure's values for the size (amlhpc/core/catalog/nccl.toml) and lists the ones
that depend on the node in AMLHPC_NCCL_RESOLVE, a JSON object {variable: kind}:

- "topology": a topology or graph file, given relative to the job's code snapshot
  (`nccl-topo/<file>`). It becomes an absolute path to the first copy found: the snapshot
  (the job's working directory, or the folder this package was loaded from), then the
  training image's /opt/aml-hpc/nccl-topo. When neither has it the variable is removed with
  a warning: NCCL ignores a missing file silently, so pointing at one would hide the problem.
- "ib-port": one device port in Azure's naming (mlx5_ib0:1). Kept when the node has an
  InfiniBand device of that name, else replaced by the node's first active InfiniBand port
  (older hosts name them mlx5_0...). Never an Ethernet-link RDMA device such as mlx5_an0.
- "ib-ports": NCCL_IB_HCA's exact list (=dev:port,...). Replaced by the node's active
  InfiniBand ports when the names differ.
- "imex": NCCL_MNNVL_ENABLE on the GB200/GB300 sizes. Multi-node NVLink shares GPU memory
  between VMs through an IMEX channel (/dev/nvidia-caps-imex-channels/channelN, created by the
  hosts' nvidia-imex service and passed into the container: an AKS ComputeDomain or a
  `--device` flag). Without one NCCL's multi-node NVLink cannot start, so the value becomes 0
  with a warning that says how to get a channel; the job then runs over InfiniBand.

`apply(environ, sysfs)` edits the mapping in place and returns what it changed, for the log.
Standard library only: it ships in the image with the rest of amlhpc/jobs/runtime.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from pathlib import Path

from amlhpc.jobs.runtime.base import contract
from amlhpc.jobs.runtime.base.errors import RuntimeInputError
from amlhpc.jobs.runtime.node.rdma import infiniband_ports

RESOLVE_VAR = contract.NCCL_RESOLVE
SNAPSHOT_TOPO_DIR = "nccl-topo"
"""Folder of the topology files inside the job's code snapshot (amlhpc/jobs/plan/build.py puts them there)."""
IMAGE_TOPO_DIR = "/opt/aml-hpc/nccl-topo"
IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
"""Where NVIDIA's driver exposes IMEX channels (NVIDIA IMEX guide: channel0 ... channelN)."""
"""Where the training images install them (amlhpc/images/catalog.py NCCL_TOPO_DIR)."""
KINDS = ("topology", "ib-port", "ib-ports", "imex")
_PACKAGE_ROOT = Path(__file__).resolve().parents[4]
_FIX = "the job builder sets it (amlhpc/jobs/plan/tuning.py); resubmit the job, or remove the variable"


def resolve_spec(environ: MutableMapping[str, str]) -> dict[str, str]:
    """AMLHPC_NCCL_RESOLVE as {variable: kind}; RuntimeInputError naming what is wrong."""
    text = environ.get(RESOLVE_VAR, "").strip()
    if not text:
        return {}
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RuntimeInputError.single(RESOLVE_VAR, "", f"is not valid JSON ({exc.msg})", _FIX) from None
    if not isinstance(spec, dict) or not all(isinstance(k, str) and v in KINDS for k, v in spec.items()):
        raise RuntimeInputError.single(RESOLVE_VAR, "", f"must map variable names to one of {', '.join(KINDS)}, got {text[:200]!r}",
                                       _FIX)
    return spec


def find_topology_file(value: str, cwd: Path | None = None, package_root: Path = _PACKAGE_ROOT,
                       image_dir: Path = Path(IMAGE_TOPO_DIR)) -> Path | None:
    """The first existing copy of a topology file named relative to the snapshot, or None."""
    given = Path(value)
    if given.is_absolute():
        return given if given.is_file() else None
    for candidate in ((cwd or Path.cwd()) / given, package_root / given, image_dir / given.name):
        if candidate.is_file():
            return candidate.resolve()
    return None


def imex_channels(imex_dir: Path = Path(IMEX_CHANNEL_DIR)) -> list[str]:
    """The IMEX channel devices this container can use (channel0, ...), sorted."""
    try:
        return sorted(p.name for p in imex_dir.iterdir() if p.name.startswith("channel"))
    except OSError:
        return []


def apply(environ: MutableMapping[str, str], sysfs: Path = Path("/sys"), *, cwd: Path | None = None,
          package_root: Path = _PACKAGE_ROOT, image_dir: Path = Path(IMAGE_TOPO_DIR),
          imex_dir: Path = Path(IMEX_CHANNEL_DIR)) -> list[str]:
    """Resolve every listed variable in place; returns one line per change (warnings start with "warning:")."""
    notes: list[str] = []
    spec = resolve_spec(environ)
    ports = [p for p in infiniband_ports(sysfs) if p.state == "ACTIVE"] if set(spec.values()) - {"topology", "imex"} else []
    for name, kind in sorted(spec.items()):
        value = environ.get(name)
        if value is None:
            continue
        if kind == "imex":
            if value != "0" and not imex_channels(imex_dir):
                environ[name] = "0"
                notes.append(f"warning: {name}=0: no IMEX channel in {imex_dir} (multi-node NVLink needs one: run the job "
                             "with the hosts' nvidia-imex service and pass /dev/nvidia-caps-imex-channels/channel0 into "
                             "the container, e.g. an AKS ComputeDomain); NCCL uses InfiniBand between the VMs instead")
            continue
        if kind == "topology":
            found = find_topology_file(value, cwd, package_root, image_dir)
            if found is None:
                del environ[name]
                notes.append(f"warning: {name}: {Path(value).name} is neither in the job's code snapshot ({SNAPSHOT_TOPO_DIR}/) "
                             f"nor in the image ({image_dir}): unset, so NCCL detects the topology itself "
                             "(without Azure's map it may pair GPUs with the wrong HCAs)")
            elif str(found) != value:
                environ[name] = str(found)
                notes.append(f"{name}={found}")
        elif not ports:
            notes.append(f"warning: {name}={value} kept: this node shows no active InfiniBand port in {sysfs}/class/infiniband")
        elif kind == "ib-port":
            device = value.split(":", 1)[0]
            if not any(p.device == device for p in ports):
                environ[name] = ports[0].name
                notes.append(f"{name}={ports[0].name} (this node has no InfiniBand device {device}; "
                             f"its InfiniBand ports: {', '.join(p.name for p in ports)})")
        else:  # ib-ports
            wanted = "=" + ",".join(p.name for p in ports)
            if value != wanted:
                environ[name] = wanted
                notes.append(f"{name}={wanted} (the node's active InfiniBand ports)")
    return notes
