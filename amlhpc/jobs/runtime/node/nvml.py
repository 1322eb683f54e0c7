"""NVML, found and initialised lazily: the GPU management library behind nvidia-smi.

The Python bindings are `nvidia-ml-py` (module `pynvml`); the training image installs
them. Importing this module never touches a GPU: `open_nvml()` does, and says why when
NVML cannot be used (no bindings, no driver), so callers report a check as skipped instead
of failing or faking it. Tests pass a fake module with the same names.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass
class NvmlSession:
    """An initialised NVML (`lib`) or the reason there is none."""

    lib: Any | None
    reason: str = ""

    def close(self) -> None:
        if self.lib is not None:
            try:
                self.lib.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a library that is going away anyway
                pass
            self.lib = None

    def __enter__(self) -> NvmlSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_nvml(module: Any | None = None) -> NvmlSession:
    """Initialise NVML from `module` (default: import pynvml)."""
    if module is None:
        try:
            module = importlib.import_module("pynvml")
        except ImportError:
            return NvmlSession(None, "the NVML bindings (pip package nvidia-ml-py) are not installed")
    try:
        module.nvmlInit()
    except module.NVMLError as exc:
        return NvmlSession(None, f"NVML did not initialise ({error_text(module, exc)}): no NVIDIA driver loaded?")
    return NvmlSession(module)


def error_text(lib: Any, exc: BaseException) -> str:
    """A short description of an NVMLError (the bindings' str() of it, or its code)."""
    text = str(exc)
    return text or f"NVML error {getattr(exc, 'value', '?')}"


def is_error(lib: Any, exc: BaseException, *names: str) -> bool:
    """Whether `exc` is the NVML error with one of the constant `names` (e.g. NVML_ERROR_NOT_SUPPORTED)."""
    value = getattr(exc, "value", None)
    return any(value == getattr(lib, name, object()) for name in names)


def bus_id(lib: Any, handle: Any) -> str:
    """The PCI bus id of a device as text ("00000001:00:00.0")."""
    raw = lib.nvmlDeviceGetPciInfo(handle).busId
    return raw.decode() if isinstance(raw, bytes) else str(raw)
