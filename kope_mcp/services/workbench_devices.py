"""Where the workbench compiles, tests and profiles: this server's targets and a cluster's devices, how a call picks
one, and the measurement slot each device's profiles queue for. A mixin of :class:`~kope_mcp.services.workbench.
Workbench`, kept apart so workbench.py is the compile -> test -> profile workflow."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from kope_mcp.errors import (
    DeviceLostError,
    TargetUnavailableError,
    TaskNotOnTargetError,
    UnknownBackendError,
    UnknownDeviceError,
)
from kope_mcp.models import DeviceInfo, DeviceList
from kope_mcp.services.fair_slot import FairSlot
from kope_mcp.settings import KopeSettings
from kope_mcp.targets.base import Target
from kope_mcp.tasks.loader import Task

if TYPE_CHECKING:
    from kope_mcp.cluster.dispatch import ClusterRoster


class WorkbenchDevices:
    if TYPE_CHECKING:
        settings: KopeSettings
        targets: dict[str, Target]
        cluster: ClusterRoster | None
        _measure_slot: FairSlot
        _device_slots: dict[str, FairSlot]
        _slots_lock: threading.Lock

    def all_targets(self) -> dict[str, Target]:
        """This server's targets by backend name, and the cluster's devices by device id."""
        return {**self.targets, **(self.cluster.devices() if self.cluster is not None else {})}

    def target(self, name: str, task: Task | None = None) -> Target:
        """The target named ``name`` (a backend here, or a cluster device's id), usable here and for ``task``;
        raises a fixable error otherwise."""
        targets = self.all_targets() if "@" in name else self.targets
        if name not in targets:
            if "@" in name:
                raise UnknownDeviceError(name, [d for d in targets if "@" in d])
            raise UnknownBackendError(name, self.targets)
        target = targets[name]
        status = target.status()
        if not status.compile:
            usable = [n for n, t in targets.items() if t.status().compile]
            raise TargetUnavailableError(f"backend {name!r} cannot be used on this server: {status.why_not}. "
                                         f"Usable here: {', '.join(usable) or 'none'} (`kope doctor` says more)")
        if task is not None and not target.supports(task):
            on = [n for n, t in self.targets.items() if t.supports(task)]
            raise TaskNotOnTargetError(f"task {task.id!r} has no {target.language} version; backends for it: "
                                       f"{', '.join(on)} (list_tasks shows each task's backends)")
        return target

    def target_hardware_key(self, name: str) -> str:
        """The hardware key results on backend ``name`` are recorded under; raises ``unknown_backend``."""
        targets = self.all_targets() if "@" in name else self.targets
        if name not in targets:
            raise UnknownBackendError(name, targets)
        return targets[name].hardware().key

    def backends_for(self, task: Task) -> list[str]:
        return [name for name, t in self.targets.items() if t.supports(task)]

    def list_devices(self) -> DeviceList:
        """Every place a kernel can be compiled, tested and profiled: this server's backends, then the cluster's."""
        devices, warnings = [], []
        remote: dict[str, Target] = {}
        if self.cluster is not None:
            try:
                remote = dict(self.cluster.devices(refresh=True))
            except DeviceLostError as exc:  # the cluster being down must not hide this machine's own devices
                warnings.append(exc.detail)
            if self.cluster.link.warning:
                warnings.append(self.cluster.link.warning)
            warnings.extend(f"cluster actor {name} is not offered: {why}"
                            for name, why in sorted(self.cluster.refused.items()))
        for key, target in {**self.targets, **remote}.items():
            status = target.status()
            state = ("ready" if status.profile else
                     f"compile and test only: {status.why_not}" if status.run else
                     f"compile only: {status.why_not}" if status.compile else f"unavailable: {status.why_not}")
            described = getattr(target, "described", None)
            devices.append(DeviceInfo(
                id=key, backend=target.name, hardware_key=target.hardware().key, status=state,
                where=f"worker {described.worker} on {described.host}" if described is not None else "this server",
                queue=self.measure_slot(key).queue))
        return DeviceList(devices=devices, cluster=self.settings.cluster or None, warnings=warnings)

    def _device_for(self, backend: str) -> str:
        """Where a call without ``device`` runs: this server's own target for ``backend`` when it can time kernels,
        else the cluster's device of that backend with the fewest profiles queued (none: stay here, and the call
        says what this server cannot do)."""
        local = self.targets.get(backend)
        if self.cluster is None or (local is not None and local.status().profile):
            return backend
        try:
            ready = [(self.measure_slot(key).queue, key) for key, target in self.cluster.devices().items()
                     if target.name == backend and target.status().profile]
        except DeviceLostError:
            return backend
        return min(ready)[1] if ready else backend

    def measure_slot(self, target: str) -> FairSlot:
        """This machine's targets share one slot (one CPU set); each cluster device has its own."""
        if "@" not in target:
            return self._measure_slot
        with self._slots_lock:
            return self._device_slots.setdefault(target, FairSlot())
