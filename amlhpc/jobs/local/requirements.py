"""What a rehearsal needs from this machine, checked before anything starts.

`check(recipe, ...)` looks at the recipe's `local.requires` (Python modules, a GPU, network
endpoints) and at what every rehearsal needs (Azurite and Node.js unless a Blob
connection string is given; inputs in mode `stage`), and raises one UserError naming every
unmet requirement with its fix. It imports nothing it checks (importlib.util.find_spec),
and the network probes share one short deadline, so a refusal takes a second or two:
before the offline plan, Azurite, data generation or staging.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from amlhpc.core import invocation
from amlhpc.core.errors import Problem, UserError
from amlhpc.jobs.runtime.base import contract

REPO_ROOT = Path(__file__).resolve().parents[3]
NETWORK_DEADLINE_S = 1.0
"""How long the endpoint probes may take together (DNS included)."""
NVIDIA_DEVICE_PATHS = ("/dev/nvidia0", "/proc/driver/nvidia/gpus")


@dataclass(frozen=True)
class Machine:
    """What the checks look at; tests pass their own."""

    module_available: Callable[[str], bool] | None = None
    """callable(name) -> bool; default: importlib.util.find_spec in this interpreter."""
    has_gpu: Callable[[], bool] | None = None
    """callable() -> bool; default: an NVIDIA device node or driver entry exists."""
    reachable: Callable[[list[str], float], dict[str, str | None]] | None = None
    """callable(list of host:port, deadline_s) -> {host:port: error or None}."""


def module_available(name: str) -> bool:
    """True when `name` (dotted) can be imported here; nothing is imported but its parents' packages."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def has_nvidia_gpu() -> bool:
    """An NVIDIA device node, or a GPU listed by the driver."""
    for path in map(Path, NVIDIA_DEVICE_PATHS):
        if path.is_dir():
            if any(path.iterdir()):
                return True
        elif path.exists():
            return True
    return False


def reachable(endpoints: list[str], deadline_s: float = NETWORK_DEADLINE_S) -> dict[str, str | None]:
    """TCP-connect to every host:port in parallel; {endpoint: None if it answered, else why not}."""
    results: dict[str, str | None] = {e: f"no answer within {deadline_s:g} s" for e in endpoints}

    def probe(endpoint: str) -> None:
        host, _, port = endpoint.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=deadline_s):
                results[endpoint] = None
        except OSError as exc:
            results[endpoint] = exc.strerror or type(exc).__name__

    threads = [threading.Thread(target=probe, args=(e,), daemon=True) for e in endpoints]
    for t in threads:
        t.start()
    end = time.monotonic() + deadline_s
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    return dict(results)


def azurite_problems(env: Mapping[str, str]) -> list[Problem]:
    """Azurite (npm) and Node.js, unless the caller brings its own Blob connection string."""
    if env.get(contract.BLOB_CONNECTION_STRING):
        return []
    from amlhpc.jobs.local import azurite

    problems = []
    if azurite.find(env.get("PATH")) is None:
        problems.append(Problem("Azurite (the local Blob service)", "", f"{azurite.AZURITE_COMMAND} is not installed "
                                "(neither in this project's node_modules nor on PATH)",
                                f"{azurite.install_hint()}; or set {contract.BLOB_CONNECTION_STRING} to a running "
                                "Azurite's connection string"))
    if shutil.which("node", path=env.get("PATH")) is None:
        problems.append(Problem("Node.js", "", "`node` is not on PATH (Azurite runs on it)",
                                "install Node.js 20 or newer (https://nodejs.org)"))
    return problems


def _install_hint(missing: list[str]) -> str:
    """The commands that install `missing` here; PyTorch as its CPU build (enough for a
    rehearsal, without the gigabytes of CUDA libraries pip's default build brings on Linux)."""
    others = [m for m in missing if m not in ("torch", "numpy") or "torch" not in missing]
    commands = [invocation.torch_cpu()] if "torch" in missing else []
    if others:
        commands.append(invocation.python_modules(" ".join(others)))
    return " and ".join(commands)


def check(recipe, env: Mapping[str, str] | None = None, machine: Machine | None = None) -> None:
    """Raise UserError listing everything this machine lacks to rehearse `recipe`."""
    env = os.environ if env is None else env
    machine = machine or Machine()
    available = machine.module_available or module_available
    gpu = machine.has_gpu or has_nvidia_gpu
    probe = machine.reachable or reachable
    needs = recipe.local.requires
    where = recipe.reference
    problems: list[Problem] = []

    # the network probes run while the rest is checked
    answers: dict[str, str | None] = {}
    prober = threading.Thread(target=lambda: answers.update(probe(list(needs.network), NETWORK_DEADLINE_S)), daemon=True)
    if needs.network:
        prober.start()

    if needs.gpu and not gpu():
        problems.append(Problem(where, "local.requires.gpu", "needs an NVIDIA GPU; this machine has none "
                                f"(no {' or '.join(NVIDIA_DEVICE_PATHS)})", "run it on a GPU machine or submit it to a GPU cluster"))
    # torch's object collectives (the health gate's exchange) need NumPy, which a CPU build of
    # torch does not bring with it
    modules = [*needs.modules, *(["numpy"] if "torch" in needs.modules and "numpy" not in needs.modules else [])]
    missing = [m for m in modules if not available(m)]
    if missing:
        problems.append(Problem(where, "local.requires.modules", f"needs Python module{'s' if len(missing) > 1 else ''} "
                                f"{', '.join(missing)}, not installed in this environment",
                                f"install {'it' if len(missing) == 1 else 'them'} into this environment: "
                                + _install_hint(missing) + ", or use the recipe's image on Azure"))
    for name, spec in recipe.inputs.items():
        if spec.mode != "stage":
            problems.append(Problem(where, f"inputs.{name}.mode", f"is {spec.mode}: Azure ML itself provides such inputs, "
                                    "a rehearsal stages inputs only", f"--set inputs.{name}.mode=stage, if the command reads "
                                    f"${contract.data_dir_var(name)}"))
    problems += azurite_problems(env)

    if needs.network:
        prober.join(NETWORK_DEADLINE_S + 0.5)
        down = {e: answers.get(e, "no answer") for e in needs.network if answers.get(e, "no answer") is not None}
        if down:
            problems.append(Problem(where, "local.requires.network", "downloads from "
                                    + ", ".join(f"{e} ({why})" for e, why in down.items()) + " at run time: unreachable from here",
                                    "run it where that endpoint is reachable"))
    if problems:
        if needs.hint:  # the recipe's own advice replaces the generic one for the first reason
            first = problems[0]
            problems[0] = Problem(first.reference, first.path, first.message, invocation.spoken(needs.hint))
        raise UserError(problems, f"cannot rehearse {recipe.name} on this machine")
