"""What a GPU run's sandbox reaches of the host: the assigned GPU's device nodes and the driver's libraries, and
nothing else of ``/dev``.

bubblewrap's ``--dev /dev`` is a minimal tmpfs (null, zero, random, tty, shm): without NVIDIA's nodes the driver
finds no device (torch: ``No CUDA GPUs are available``). A GPU run adds, read-write (``--dev-bind``), exactly:

- ``/dev/nvidia<minor>`` of the assigned GPU (not the machine's other GPUs),
- ``/dev/nvidiactl`` (the driver's control node; every CUDA process opens it),
- ``/dev/nvidia-uvm`` (the unified-memory driver the CUDA runtime needs at start),

and never ``nvidia-uvm-tools`` (profiler counters of every process) nor ``nvidia-caps`` (MIG and the
capabilities of administrators). ``CUDA_VISIBLE_DEVICES`` names the assigned device alone, in PCI order
(``CUDA_DEVICE_ORDER=PCI_BUS_ID``, the order of the nodes' minors). The driver's user-space libraries
(``libcuda``, ``libnvidia-ml``, the PTX JIT) are bound read-only at their own paths wherever ``ldconfig`` finds
them outside the folders every run already has (``/usr``, ``/lib``...): a GPU operator's ``/run/nvidia/driver``
say. A CPU run gets none of this.

Measured on an H200 (shared/STACK-NOTES.md): that sandbox, with a per-run uid and the system-call filter, runs
torch, Triton's JIT and nvcc-built kernels; the filter allows by default, so ``ioctl`` and ``mmap`` of device
memory are not in its way. The CUDA runtime reserves tens of GiB of address space at start, so a GPU run's
memory bound is ``RLIMIT_DATA`` (what it allocates on the host) instead of ``RLIMIT_AS``.
"""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

CONTROL_NODES = ("nvidiactl", "nvidia-uvm")
DRIVER_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4")
# Folders every run has read-only already (sandbox_setup._SYSTEM_DIRS): a library under them needs no bind.
_ALREADY_BOUND = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/", "/libx32/")


class GpuNodesUnavailable(Exception):
    """The assigned GPU cannot be handed to a run; the message says which node and why."""


@dataclass(frozen=True)
class GpuBinding:
    """The assigned GPU as a run sees it."""

    index: int  # the device's index in PCI order (what CUDA_VISIBLE_DEVICES names)
    nodes: tuple[str, ...]  # device nodes bound read-write at their own paths
    libraries: tuple[Path, ...]  # driver library folders bound read-only at their own paths
    # Folders the loader must be told about: where libcuda was found only through the server's LD_LIBRARY_PATH
    # (NVIDIA's container images), which a run's scrubbed environment does not carry.
    search_path: tuple[Path, ...] = ()

    def env(self) -> dict[str, str]:
        env = {"CUDA_VISIBLE_DEVICES": str(self.index), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        if self.search_path:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(map(str, self.search_path))
        return env


def _ldconfig_listing() -> str:
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            return subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=20,
                                  check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
    return ""


def driver_library_dirs(listing: str) -> tuple[Path, ...]:
    """The folders of the driver's libraries (as ``ldconfig -p`` lists them, links resolved) that a run does not
    already see."""
    found: dict[Path, None] = {}
    for line in listing.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.split(" ", 1)[0] not in DRIVER_LIBRARIES or not path:
            continue
        for candidate in (Path(path), Path(os.path.realpath(path))):
            folder = candidate.parent
            if not (str(folder) + "/").startswith(_ALREADY_BOUND) and folder.is_dir():
                found[folder] = None
    return tuple(found)


def loaded_driver_dirs(maps: str | None = None) -> tuple[Path, ...]:
    """Where this process's loader finds libcuda (it is loaded here: targets/gpu.py detected the GPU through it),
    as ``/proc/self/maps`` shows it: the folder that holds it, not listed by ``ldconfig`` where the server found
    it only through LD_LIBRARY_PATH."""
    if maps is None:
        try:
            import ctypes

            ctypes.CDLL("libcuda.so.1")
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return ()
    found: dict[Path, None] = {}
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if Path(path).name.startswith("libcuda.so"):
            found[Path(path).parent] = None
    return tuple(found)


def check_node(path: Path, *, per_run_uid: bool) -> None:
    """The node exists, is a character device, and a run's identity may open it."""
    try:
        info = path.stat()
    except OSError as exc:
        raise GpuNodesUnavailable(f"{path} is missing ({exc.strerror}); is the NVIDIA driver loaded? "
                                  + ("(nvidia-uvm is created by `nvidia-modprobe -u -c=0` or the first CUDA "
                                     "program run as root)" if path.name == "nvidia-uvm" else "")) from None
    if not stat.S_ISCHR(info.st_mode):
        raise GpuNodesUnavailable(f"{path} is not a character device")
    mode = stat.S_IMODE(info.st_mode)
    if per_run_uid and mode & 0o006 != 0o006:
        # A root server's runs have uids of their own, in no group: only the nodes' "other" bits let them in.
        raise GpuNodesUnavailable(f"{path} is mode {mode:04o}: a run's own uid cannot open it (the NVIDIA driver's "
                                  "default is 0666; set NVreg_DeviceFileMode=0666 or run the server as a user of "
                                  "the device's group)")


def gpu_binding(index: int, *, per_run_uid: bool, dev: Path = Path("/dev"), listing: str | None = None,
                maps: str | None = None) -> GpuBinding:
    """The nodes and libraries of GPU ``index``; raises :class:`GpuNodesUnavailable` with the reason."""
    if index < 0:
        raise GpuNodesUnavailable(f"GPU index {index} is not a device index (0, 1, ...)")
    nodes = [dev / f"nvidia{index}", *(dev / name for name in CONTROL_NODES)]
    for node in nodes:
        check_node(node, per_run_uid=per_run_uid)
    listing = _ldconfig_listing() if listing is None else listing
    listed = {Path(line.partition(" => ")[2]).parent for line in listing.splitlines() if " => " in line}
    unlisted = tuple(d for d in loaded_driver_dirs(maps) if d not in listed)
    libraries = tuple(dict.fromkeys([*driver_library_dirs(listing),
                                     *(d for d in unlisted if not (str(d) + "/").startswith(_ALREADY_BOUND))]))
    return GpuBinding(index, tuple(str(n) for n in nodes), libraries, unlisted)


_bound: dict[tuple[int, bool], GpuBinding] = {}


def assigned_gpu(index: int, per_run_uid: bool) -> GpuBinding | str:
    """This machine's binding for GPU ``index``, or why there is none. A binding found is kept for the process; a
    failure is not (``nvidia-uvm`` appears once the driver loads it, and the next run should find it)."""
    found = _bound.get((index, per_run_uid))
    if found is None:
        try:
            found = _bound[(index, per_run_uid)] = gpu_binding(index, per_run_uid=per_run_uid)
        except GpuNodesUnavailable as exc:
            return str(exc)
    return found
