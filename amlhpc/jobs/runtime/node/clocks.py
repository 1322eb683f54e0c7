"""GPU application clocks at their maximum for the job, reset afterwards (the NDv4 performance article).

The NDv4 performance article queries `clocks.max.graphics`/`clocks.max.mem` and sets them with
`nvidia-smi -ac MEM,GRAPHICS` (A100: 1215 MHz memory, 1410 MHz SM). We do the same
through NVML, choosing the highest memory clock and the highest graphics clock supported
*at that memory clock*, which NVML guarantees to be an accepted pair. Afterwards the
application clocks are reset to the driver's defaults. (The seed resets with
`nvidia-smi -rgc`, which undoes *locked* clocks; `-ac` is undone by `-rac`, i.e.
nvmlDeviceResetApplicationsClocks, which is what we call.)

Setting clocks needs root unless an admin relaxed it (`nvidia-smi -acp UNRESTRICTED`);
some GPUs do not support application clocks. Either way the GPU is reported as skipped
with the reason; nothing fails. Only one process per node should do this (the launcher's
local rank 0).

`python -m amlhpc.jobs.runtime.node.clocks show|max|reset` does the same by hand.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from amlhpc.jobs.runtime.node.nvml import NvmlSession, bus_id, error_text, is_error, open_nvml


@dataclass(frozen=True)
class ClockChange:
    index: int
    bus_id: str
    status: str
    """"set", "reset", "skipped" or "failed"."""
    memory_mhz: int | None = None
    graphics_mhz: int | None = None
    reason: str = ""


def _why_not(lib: Any, exc: BaseException, name: str) -> tuple[str, str]:
    if is_error(lib, exc, "NVML_ERROR_NO_PERMISSION"):
        return "skipped", "not permitted: needs root, or an admin's `nvidia-smi -acp UNRESTRICTED`"
    if is_error(lib, exc, "NVML_ERROR_NOT_SUPPORTED"):
        return "skipped", f"{name} does not support application clocks"
    return "failed", error_text(lib, exc)


def _name(lib: Any, handle: Any) -> str:
    raw = lib.nvmlDeviceGetName(handle)
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def max_supported_pair(lib: Any, handle: Any) -> tuple[int, int]:
    """(memory MHz, graphics MHz): the top memory clock and the top graphics clock valid with it."""
    memory = max(lib.nvmlDeviceGetSupportedMemoryClocks(handle))
    graphics = max(lib.nvmlDeviceGetSupportedGraphicsClocks(handle, memory))
    return int(memory), int(graphics)


def set_max_clocks(lib: Any) -> list[ClockChange]:
    """Set every GPU's application clocks to the maximum; one result per GPU."""
    results = []
    for index in range(lib.nvmlDeviceGetCount()):
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        address, name = bus_id(lib, handle), _name(lib, handle)
        try:
            memory, graphics = max_supported_pair(lib, handle)
            lib.nvmlDeviceSetApplicationsClocks(handle, memory, graphics)
        except lib.NVMLError as exc:
            status, reason = _why_not(lib, exc, name)
            results.append(ClockChange(index, address, status, reason=reason))
            continue
        results.append(ClockChange(index, address, "set", memory, graphics))
    return results


def reset_clocks(lib: Any, indices: list[int] | None = None) -> list[ClockChange]:
    """Reset application clocks to the defaults (on `indices`, default every GPU)."""
    results = []
    for index in range(lib.nvmlDeviceGetCount()) if indices is None else indices:
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        address = bus_id(lib, handle)
        try:
            lib.nvmlDeviceResetApplicationsClocks(handle)
        except lib.NVMLError as exc:
            status, reason = _why_not(lib, exc, _name(lib, handle))
            results.append(ClockChange(index, address, status, reason=reason))
            continue
        results.append(ClockChange(index, address, "reset"))
    return results


@contextmanager
def max_application_clocks(session: NvmlSession | None = None) -> Iterator[list[ClockChange]]:
    """Clocks at maximum inside the block; the GPUs we changed are reset on the way out,
    whatever happens in the block. Yields the per-GPU results (empty without NVML)."""
    own = session is None
    session = open_nvml() if session is None else session
    try:
        if session.lib is None:
            yield []
            return
        changes = set_max_clocks(session.lib)
        try:
            yield changes
        finally:
            changed = [c.index for c in changes if c.status == "set"]
            if changed:
                reset_clocks(session.lib, changed)
    finally:
        if own:
            session.close()


def show_clocks(lib: Any) -> list[dict]:
    """Current and maximum application clocks per GPU."""
    rows = []
    for index in range(lib.nvmlDeviceGetCount()):
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        row = {"index": index, "busId": bus_id(lib, handle), "name": _name(lib, handle)}
        try:
            row["applicationMemoryMhz"] = lib.nvmlDeviceGetApplicationsClock(handle, lib.NVML_CLOCK_MEM)
            row["applicationGraphicsMhz"] = lib.nvmlDeviceGetApplicationsClock(handle, lib.NVML_CLOCK_GRAPHICS)
            row["maxMemoryMhz"], row["maxGraphicsMhz"] = max_supported_pair(lib, handle)
        except lib.NVMLError as exc:
            row["error"] = error_text(lib, exc)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    """`python -m amlhpc.jobs.runtime.node.clocks show|max|reset`: exit 0, or 1 when a GPU failed."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m amlhpc.jobs.runtime.node.clocks", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("show", "max", "reset"))
    args = parser.parse_args(argv)
    with open_nvml() as session:
        if session.lib is None:
            print(f"clocks: {session.reason}", file=sys.stderr)
            return 1
        if args.action == "show":
            print(json.dumps(show_clocks(session.lib), indent=2))
            return 0
        results = set_max_clocks(session.lib) if args.action == "max" else reset_clocks(session.lib)
        print(json.dumps([asdict(r) for r in results], indent=2))
        return 1 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
