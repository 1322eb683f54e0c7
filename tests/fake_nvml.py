"""A fake NVML module for tests: the names amlhpc.jobs.runtime.{nvml,clocks,health.ecc} call, with
the constants and error codes of the real bindings (nvidia-ml-py's pynvml), backed by a
list of `FakeGpu` records a test sets up. tests/test_clocks.py checks that every name
used here exists in the real pynvml with the same value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Values from nvml.h / pynvml.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_LOCATION_DRAM = 2
NVML_MEMORY_LOCATION_SRAM = 7
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_ERROR_TIMEOUT = 10
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1

CONSTANTS = [name for name in dir() if name.startswith("NVML_")]
nvmlEventTypeXidCriticalError = 0x8
EVENT_CONSTANTS = ["nvmlEventTypeXidCriticalError"]
"""Constants the real bindings spell in lower case (checked like CONSTANTS)."""


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 4: "Insufficient Permissions", 9: "Driver Not Loaded", 10: "Timeout"}.get(
            self.value, f"code {self.value}")


@dataclass
class FakeGpu:
    bus_id: str
    name: str = "NVIDIA A100-SXM4-40GB"
    memory_clocks: tuple[int, ...] = (1215, 877, 405)
    graphics_clocks: dict[int, tuple[int, ...]] = field(default_factory=lambda: {1215: (1410, 1395, 1005, 210), 877: (1200,), 405: (405,)})
    app_clocks: dict[int, int] = field(default_factory=lambda: {NVML_CLOCK_MEM: 1215, NVML_CLOCK_GRAPHICS: 1095})
    default_app_clocks: dict[int, int] = field(default_factory=lambda: {NVML_CLOCK_MEM: 1215, NVML_CLOCK_GRAPHICS: 1095})
    clocks_error: int | None = None
    """Error code SetApplicationsClocks/Reset raise (permission, not supported)."""
    ecc_enabled: bool = True
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    """(correctable, uncorrectable, pending, failure); None: not supported (V100)."""
    sram_uncorrectable: dict[int, int] = field(default_factory=lambda: {NVML_VOLATILE_ECC: 0, NVML_AGGREGATE_ECC: 0})
    ecc_counts: dict[tuple[int, int, int], int] = field(default_factory=dict)
    """Other memory error counters: (error type, counter type, location) -> count (0 when absent)."""
    sram_supported: bool = True
    """SRAM counters exist (A100 and later); V100's NVML answers NOT_SUPPORTED."""
    retired_pages: tuple[int, int] | None = None
    """(single-bit, double-bit) retired pages; None: not supported (A100 and later remap rows instead)."""
    retirement_pending: bool = False
    # telemetry readings (units as NVML returns them)
    util: tuple[int, int] = (97, 41)
    """(gpu %, memory %)"""
    memory_bytes: tuple[int, int] = (30 << 30, 40 << 30)
    """(used, total)"""
    power_mw: int = 350_000
    power_limit_mw: int = 400_000
    temperature_c: int = 62
    sm_clock_mhz: int = 1410
    memory_clock_mhz: int = 1215
    event_reasons: int = 0
    """Clocks event reason bit mask (nvml.h nvmlClocksEventReason*)."""
    pending_xids: list[int] = field(default_factory=list)
    """XID events NVML will deliver to a registered event set."""
    unsupported: tuple[str, ...] = ()
    """NVML functions that answer NOT_SUPPORTED for this GPU (e.g. power on some boards)."""


class FakeNvml:
    """Instances behave like the pynvml module."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None):
        self.gpus = gpus
        self.init_error = init_error
        self.calls: list[tuple] = []
        self.initialised = False
        for name in CONSTANTS + EVENT_CONSTANTS:
            setattr(self, name, globals()[name])

    # session
    def nvmlInit(self):
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    # devices
    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def nvmlDeviceGetName(self, gpu):
        return gpu.name

    def nvmlDeviceGetPciInfo(self, gpu):
        return type("PciInfo", (), {"busId": gpu.bus_id.encode()})()

    # clocks
    def nvmlDeviceGetSupportedMemoryClocks(self, gpu):
        return list(gpu.memory_clocks)

    def nvmlDeviceGetSupportedGraphicsClocks(self, gpu, memory):
        return list(gpu.graphics_clocks[memory])

    def nvmlDeviceGetApplicationsClock(self, gpu, kind):
        return gpu.app_clocks[kind]

    def nvmlDeviceSetApplicationsClocks(self, gpu, memory, graphics):
        self.calls.append(("set", gpu.bus_id, memory, graphics))
        if gpu.clocks_error is not None:
            raise NVMLError(gpu.clocks_error)
        if graphics not in gpu.graphics_clocks.get(memory, ()):
            raise NVMLError(2)  # invalid argument: not a supported pair
        gpu.app_clocks = {NVML_CLOCK_MEM: memory, NVML_CLOCK_GRAPHICS: graphics}

    def nvmlDeviceResetApplicationsClocks(self, gpu):
        self.calls.append(("reset", gpu.bus_id))
        if gpu.clocks_error is not None:
            raise NVMLError(gpu.clocks_error)
        gpu.app_clocks = dict(gpu.default_app_clocks)

    # memory health
    def nvmlDeviceGetEccMode(self, gpu):
        return [int(gpu.ecc_enabled), int(gpu.ecc_enabled)]

    def nvmlDeviceGetRemappedRows(self, gpu):
        if gpu.remapped_rows is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.remapped_rows

    def nvmlDeviceGetMemoryErrorCounter(self, gpu, error_type, counter_type, location):
        assert location in (NVML_MEMORY_LOCATION_SRAM, NVML_MEMORY_LOCATION_DRAM)
        if location == NVML_MEMORY_LOCATION_SRAM and not gpu.sram_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if (error_type, location) == (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_MEMORY_LOCATION_SRAM):
            return gpu.sram_uncorrectable[counter_type]
        return gpu.ecc_counts.get((error_type, counter_type, location), 0)

    def nvmlDeviceGetRetiredPages(self, gpu, cause):
        if gpu.retired_pages is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        single, double = gpu.retired_pages
        count = single if cause == NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS else double
        return [0x1000 + 0x1000 * i for i in range(count)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, gpu):
        if gpu.retired_pages is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(gpu.retirement_pending)


    # telemetry
    def _reading(self, gpu, name):
        if name in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetUtilizationRates(self, gpu):
        self._reading(gpu, "nvmlDeviceGetUtilizationRates")
        return type("Utilization", (), {"gpu": gpu.util[0], "memory": gpu.util[1]})()

    def nvmlDeviceGetMemoryInfo(self, gpu):
        self._reading(gpu, "nvmlDeviceGetMemoryInfo")
        used, total = gpu.memory_bytes
        return type("Memory", (), {"used": used, "total": total, "free": total - used})()

    def nvmlDeviceGetPowerUsage(self, gpu):
        self._reading(gpu, "nvmlDeviceGetPowerUsage")
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu):
        self._reading(gpu, "nvmlDeviceGetEnforcedPowerLimit")
        return gpu.power_limit_mw

    def nvmlDeviceGetTemperature(self, gpu, sensor):
        assert sensor == NVML_TEMPERATURE_GPU
        return gpu.temperature_c

    def nvmlDeviceGetClockInfo(self, gpu, kind):
        return {NVML_CLOCK_SM: gpu.sm_clock_mhz, NVML_CLOCK_MEM: gpu.memory_clock_mhz}[kind]

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu):
        return gpu.event_reasons

    # events
    def nvmlEventSetCreate(self):
        return {"registered": [], "freed": False}

    def nvmlDeviceRegisterEvents(self, gpu, types, event_set):
        assert types == nvmlEventTypeXidCriticalError
        event_set["registered"].append(gpu)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        for gpu in event_set["registered"]:
            if gpu.pending_xids:
                xid = gpu.pending_xids.pop(0)
                return type("EventData", (), {"device": gpu, "eventType": nvmlEventTypeXidCriticalError,
                                              "eventData": xid})()
        raise NVMLError(NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set):
        event_set["freed"] = True


FAKE_FUNCTIONS = [name for name in dir(FakeNvml) if name.startswith("nvml")]


def nd96asr_gpus(n: int = 8) -> list[FakeGpu]:
    """GPUs with the bus ids NVML reports on ND96asr_v4 (the NDv4 performance article: 00000001:00:00.0 ...)."""
    return [FakeGpu(f"0000000{i + 1}:00:00.0") for i in range(n)]
