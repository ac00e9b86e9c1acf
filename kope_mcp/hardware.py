"""What this machine offers: CPU model, ISA extensions, cores, caches, compilers, OpenMP."""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path

from pydantic import BaseModel, Field

# The ISA extensions a kernel author can act on; /proc/cpuinfo lists ~100 flags, most irrelevant here.
_RELEVANT_ISA = (
    "sse2", "sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2",
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "avx_vnni", "amx_tile", "amx_bf16", "asimd", "sve", "sve2",
)


class CacheLevel(BaseModel):
    level: int
    type: str
    size_kib: int
    shared_by_cpus: int = 1


class HardwareProfile(BaseModel):
    """The CPU that kernels run on (recorded with every measurement)."""

    key: str = Field(description="A short stable identifier, e.g. 'x86_64/AMD EPYC/2c/avx512f'.")
    arch: str
    cpu_model: str
    cores: int = Field(description="Logical CPUs this process may use.")
    isa: list[str] = Field(description="Relevant SIMD / ISA extensions.")
    caches: list[CacheLevel]


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        if ":" in line:
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    return info


def _caches() -> list[CacheLevel]:
    levels: list[CacheLevel] = []
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        try:
            size = (index / "size").read_text().strip()
            kib = int(size[:-1]) * (1024 if size.endswith("M") else 1) if size[-1] in "KM" else int(size) // 1024
            shared = (index / "shared_cpu_list").read_text().strip()
            levels.append(CacheLevel(level=int((index / "level").read_text()), type=(index / "type").read_text()
                                     .strip().lower(), size_kib=kib, shared_by_cpus=_count_cpus(shared)))
        except (OSError, ValueError):
            continue
    return levels


def _count_cpus(cpu_list: str) -> int:
    total = 0
    for part in cpu_list.split(","):
        lo, _, hi = part.partition("-")
        total += (int(hi) - int(lo) + 1) if hi else 1
    return total


def cpu_key(arch: str, model: str, cores: int, isa: list[str]) -> str:
    """The memory's hardware key of a CPU: it follows from the facts, so a described CPU's key can be checked."""
    widest = next((f for f in ("avx512f", "avx2", "avx", "sve", "asimd", "sse4_2") if f in isa), "scalar")
    return f"{arch}/{model}/{cores}c/{widest}"


@functools.cache
def detect_hardware() -> HardwareProfile:
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    isa = [f for f in _RELEVANT_ISA if f in flags]
    model = info.get("model name") or info.get("Hardware") or platform.processor() or "unknown CPU"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return HardwareProfile(
        key=cpu_key(platform.machine(), model, cores, isa),
        arch=platform.machine(),
        cpu_model=model,
        cores=cores,
        isa=isa,
        caches=_caches(),
    )


def last_level_cache_bytes(profile: HardwareProfile) -> int:
    data = [c for c in profile.caches if c.type in ("data", "unified")]
    return max((c.size_kib for c in data), default=0) * 1024


class CompilerInfo(BaseModel):
    name: str
    path: str | None
    version: str | None
    openmp: bool


def probe_compiler(name: str) -> CompilerInfo:
    path = shutil.which(name)
    if path is None:
        return CompilerInfo(name=name, path=None, version=None, openmp=False)
    try:
        version = subprocess.run([name, "--version"], capture_output=True, text=True, timeout=20,
                                 check=False).stdout.splitlines()[0]
        probe = subprocess.run([name, "-fopenmp", "-x", "c", "-", "-o", os.devnull],
                               input="#include <omp.h>\nint main(void){return omp_get_max_threads() < 1;}\n",
                               capture_output=True, text=True, timeout=60, check=False)
        openmp = probe.returncode == 0
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return CompilerInfo(name=name, path=path, version=None, openmp=False)
    return CompilerInfo(name=name, path=path, version=version, openmp=openmp)


_bandwidth_lock = threading.Lock()
_bandwidth_best_gbps = 0.0  # the memory probe's (MEMORY_PROBE_BYTES)
_bandwidth_by_size: dict[int, float] = {}  # the smaller probes', by footprint in bytes
_bandwidth_file: Path | None = None

# The probes' footprints: a working set of at least ROOF_MIN_BYTES is bounded by the probe of the largest power of
# two not above it (a smaller footprint streams at least as fast, so the bound errs towards the kernel), and one of
# MEMORY_PROBE_BYTES or more by the memory probe. What a footprint streams at depends on the machine's caches and
# the share of them this process gets, so it is measured, not derived from cache sizes: here (32 MiB L3) a
# just-written 16 MiB moved at 76-86 GB/s and 64 MiB or more at 31-35, a vectorised C sum reached 0.6-1.1x the
# probe at every size, and the suite's baselines at -O3 -march=native 1.25x at most (tools/bench_roof.py). Below
# 4 MiB (L1, L2) a kernel's
# time is mostly its calls' overhead and the loads a core can issue vary most: no bound.
ROOF_MIN_BYTES = 4 << 20
MEMORY_PROBE_BYTES = 256 << 20


def keep_bounds_in(path: Path) -> None:
    """Keep the best stream measured on this machine in ``path`` (a home's ``bounds.json``), across servers: a
    plausibility bound is never lowered by a probe taken while the machine was busy (12.6 GB/s at load 13 against
    35.6 at load 6 here), only raised by a faster one."""
    global _bandwidth_file, _bandwidth_best_gbps
    with _bandwidth_lock:
        _bandwidth_file = path
        stored = _stored_bandwidth(path)
        _bandwidth_best_gbps = max(_bandwidth_best_gbps, stored.pop(MEMORY_PROBE_BYTES, 0.0))
        for size, gbps in stored.items():
            _bandwidth_by_size[size] = max(_bandwidth_by_size.get(size, 0.0), gbps)


def probe_bytes(footprint: int | None) -> int:
    """The footprint of the probe that bounds a working set of ``footprint`` bytes (None: memory)."""
    if footprint is None or footprint >= MEMORY_PROBE_BYTES:
        return MEMORY_PROBE_BYTES
    return max(ROOF_MIN_BYTES, 1 << (max(1, footprint).bit_length() - 1))


def _stored_bandwidth(path: Path) -> dict[int, float]:
    try:
        entry = json.loads(path.read_text()).get(detect_hardware().key, {})
        found = {MEMORY_PROBE_BYTES: entry.get("stream_gbps", 0.0)}
        found.update({int(k): v for k, v in entry.get("stream_gbps_by_bytes", {}).items()})
    except (OSError, ValueError, AttributeError, TypeError):
        return {}
    return {k: float(v) for k, v in found.items() if isinstance(v, int | float) and 0 < v < 1e5 and k > 0}


def _store_bandwidth(path: Path, size: int, gbps: float) -> None:
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    entry = data.get(detect_hardware().key)
    entry = entry if isinstance(entry, dict) else {}
    if size == MEMORY_PROBE_BYTES:
        entry["stream_gbps"] = round(gbps, 3)
    else:
        by_size = entry.get("stream_gbps_by_bytes")
        entry["stream_gbps_by_bytes"] = {**(by_size if isinstance(by_size, dict) else {}), str(size): round(gbps, 3)}
    data[detect_hardware().key] = entry
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def streaming_bandwidth_gbps(*, again: bool = False, footprint: int | None = None) -> float:
    """The fastest single-thread stream this process has measured over a working set of ``footprint`` bytes
    (``probe_bytes``; None: 256 MiB, memory on most machines), in GB/s: a read (a max reduction) or a copy of half
    of it into the other half (read + write bytes).

    A busy machine only makes a probe slower, so the best seen so far is the bound; ``again`` probes once more
    (before a result above the bound is called suspect: the first probe may have run while tests or builds
    shared the memory bus). A plain copy alone understates what a read-only stream reaches by ~20-35% here
    (write-allocate traffic is not counted), which flagged honest reductions as beyond the roofline.
    Best of several of each: neighbours on a shared machine slow single probes by a third.
    """
    global _bandwidth_best_gbps
    size = probe_bytes(footprint)
    with _bandwidth_lock:
        best = _bandwidth_best_gbps if size == MEMORY_PROBE_BYTES else _bandwidth_by_size.get(size, 0.0)
        if best and not again:
            return best
        import time

        import numpy as np

        src = np.ones(size // 4, dtype=np.float32)
        half = src[: src.size // 2]
        dst = np.empty_like(half) if size == MEMORY_PROBE_BYTES else src[src.size // 2:]
        best_read = best_copy = float("inf")
        for _ in range(max(8, min(64, MEMORY_PROBE_BYTES // size))):
            t0 = time.perf_counter()
            src.max()
            t1 = time.perf_counter()
            np.copyto(dst, half)
            t2 = time.perf_counter()
            best_read, best_copy = min(best_read, t1 - t0), min(best_copy, t2 - t1)
        measured = max(src.nbytes / best_read, 2 * half.nbytes / best_copy) / 1e9
        if _bandwidth_file is not None:
            best = max(best, _stored_bandwidth(_bandwidth_file).get(size, 0.0))
            if measured > best:
                _store_bandwidth(_bandwidth_file, size, measured)
        best = max(best, measured)
        if size == MEMORY_PROBE_BYTES:
            _bandwidth_best_gbps = best
        else:
            _bandwidth_by_size[size] = best
        return best


def known_bandwidth_gbps() -> float | None:
    """The best memory stream measured so far (by this process, or kept in the bounds file), without probing."""
    with _bandwidth_lock:
        return _bandwidth_best_gbps or None


def peak_gflops(profile: HardwareProfile, threads: int) -> float:
    """An upper bound on float32 GFLOP/s: threads x a generous 5 GHz x FMA lanes x 2 FMA units x 2 flops.

    Not a prediction: a kernel reported above it did not do the work it claims (the roofline's compute side).
    """
    lanes = 16 if "avx512f" in profile.isa else 8 if "avx" in profile.isa else 4
    return threads * 5.0 * lanes * 2 * 2


def hardware_rank(key: str | None, wanted: str | None) -> int:
    """3: the same machine (or knowledge for any); 2: the same architecture and kind; 1: the same kind of device
    (a CPU for a CPU); 0: another kind (a GPU result for a CPU question). Keys look like
    ``x86_64/AMD EPYC/2c/avx512f`` and ``cuda/NVIDIA H100/sm_90``."""
    if key is None or wanted is None or key == wanted:
        return 3
    mine, theirs = key.split("/", 1)[0], wanted.split("/", 1)[0]
    if mine == theirs:
        return 2
    return 1 if (mine == "cuda") == (theirs == "cuda") else 0
