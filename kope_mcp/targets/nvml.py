"""The GPU's clocks and why they are held down, through NVML (``libnvidia-ml``, the driver's management library),
by ctypes: no CUDA context, so a profile's coordinator reads them around a measurement without touching the
device the kernels run on. Only the standard library: it runs inside the sandbox.
"""

from __future__ import annotations

import ctypes
from typing import Any

# nvmlClocksEventReasons (formerly "throttle reasons"): the ones that slow a kernel down. Idle and the
# applications-clock setting are not slowdowns.
SLOWDOWNS = {0x4: "software power cap", 0x8: "hardware slowdown", 0x20: "software thermal slowdown",
             0x40: "hardware thermal slowdown", 0x80: "hardware power brake", 0x10: "sync boost"}
_CLOCK_SM = 1


class Nvml:
    """One GPU's NVML handle, chosen by the minor number of its device node (``/dev/nvidia<minor>``), which is
    what a run is given."""

    def __init__(self, minor: int) -> None:
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit failed")
        count = ctypes.c_uint(0)
        self.lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        self.handle: Any = None
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                continue  # a GPU whose node this run does not have
            found = ctypes.c_uint(0)
            if self.lib.nvmlDeviceGetMinorNumber(handle, ctypes.byref(found)) == 0 and found.value == minor:
                self.handle = handle
                break
        if self.handle is None:
            raise OSError(f"NVML does not list the GPU /dev/nvidia{minor}")

    def _uint(self, function: str, *args: Any) -> int | None:
        value = ctypes.c_uint(0)
        return value.value if getattr(self.lib, function)(self.handle, *args, ctypes.byref(value)) == 0 else None

    def reasons(self) -> int | None:
        value = ctypes.c_ulonglong(0)
        for function in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            call = getattr(self.lib, function, None)
            if call is not None and call(self.handle, ctypes.byref(value)) == 0:
                return int(value.value)
        return None

    def reading(self) -> dict[str, Any]:
        """SM clock, its maximum, temperature, and the slowdowns in force, now."""
        mask = self.reasons()
        return {"sm_mhz": self._uint("nvmlDeviceGetClockInfo", _CLOCK_SM),
                "max_sm_mhz": self._uint("nvmlDeviceGetMaxClockInfo", _CLOCK_SM),
                "temperature_c": self._uint("nvmlDeviceGetTemperature", 0),
                "slowdowns": slowdowns(mask) if mask is not None else []}


def slowdowns(mask: int) -> list[str]:
    return [name for bit, name in SLOWDOWNS.items() if mask & bit]


def read_clocks(minor: int) -> dict[str, Any]:
    """A reading, or why there is none (NVML absent or the GPU not listed): never raises."""
    try:
        return Nvml(minor).reading()
    except (OSError, AttributeError) as exc:
        return {"unavailable": str(exc)[:200]}
