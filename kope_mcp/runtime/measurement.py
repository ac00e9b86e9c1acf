"""The measurement protocol of ``profile_kernel``, one for every target: which input set each call gets, how the
implementations take turns, when sampling stops, and which outputs are checked.

A target supplies a :class:`Device`, the primitives of its hardware for one profile (poison the candidate's output
buffers, run a batch of calls on chosen sets and time it by the device's clock, read the candidate's buffers
back); :func:`measure` drives it. C's coordinator (``harness_profile.py``, a worker process per implementation) is
one device; the contract tests' pure-Python fake is another; a GPU target is a third. What is decided here, so no
target can decide it differently:

- **Input sets**: each implementation gets every set once in its own random order (drawn from ``os.urandom``
  after the device loaded the kernels, so no kernel holds the generator), then again in a new order. Where the
  pool allows ``min_rounds`` batches of fresh sets, sampling ends before a set would be timed twice: a cache of
  results keyed by the inputs then has nothing to replay.
- **Batches**: a sample is ``inner`` calls, calibrated on one warm-up call so that a sample takes about
  ``sample_target_s`` (a timer's resolution and a scheduler's tick stay small beside it), and never more calls than
  the candidate has output buffers: each call of a batch writes its own buffer, poisoned beforehand.
- **Interleaving**: one sample per implementation per round, the order rotated every round, so none always runs
  right after another (a warm cache or a clock ramp does not favour one).
- **Stopping** (never before ``min_rounds``): before the fresh sets run out; early, once the candidate's and
  baseline's samples are within ``rel_iqr_goal`` (relative IQR); at the time cap if the paired ratios' 95% CI is
  within ``ratio_ci_goal`` of their median; otherwise sampling goes on, up to
  ``noisy_cap_factor`` times the cap (NVBench's rule: a noisy machine buys precision with time, and the answer is
  the CI it reached, not a refusal). The verdict is the ratios' median, so its CI is what must be narrow: on a VM
  with busy neighbours a softmax A/A profile stopped at the plain cap ranged 1.2-8.1% over five runs.
- **Checks**: every batch of every implementation starts from poisoned output buffers (the same state for all,
  and a call that skips work leaves poison); every timed call of the candidate is read back; the first call on a
  set is kept (it goes back to be judged against the float64 reference by the workbench) and every later call on
  that set must agree with it (:class:`Consistency`), so a kernel exact on the calls that are judged and cheap on
  the others is caught. On a device that supports them, every call after the first on a set (of the candidate and
  the baseline alike) runs on a fresh **variant** of the set instead (:mod:`kope_mcp.runtime.variants`), so no
  result can be replayed however small the pool; a few of the candidate's variant calls, drawn after the fact,
  go back to be judged against the reference on the same variant.

Only the standard library and numpy: it runs inside the sandbox, in the child that coordinates the workers.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class Device(Protocol):
    """A target's primitives for one profile. Implementations are named ``candidate``, ``baseline`` and,
    optionally, ``reference``; sets are numbered 0..count-1 in the order the target was given them."""

    def poison(self, name: str, n: int) -> None:
        """Fill the first ``n`` output buffers of ``name`` with a pattern no kernel computes. The protocol asks
        before every batch of every implementation: the candidate's so that a call that skips work is seen, the
        others' so that each batch starts from the same state (a freshly written output is partly in the cache: a
        baseline that never had it poisoned ran 1-2% slower than the identical candidate on vector_add and
        softmax). The candidate's must be poisoned by a path its kernel does not control."""

    def run(self, name: str, chosen: list[int], variants: list[int] | None = None) -> float:
        """Run ``name`` once per entry of ``chosen`` (call j on set ``chosen[j]``, into output buffer j) and
        return seconds per call by the device's clock; raise to end the measurement (a crash, tampering).
        ``variants`` (only for a device whose ``variants`` attribute is true): call j runs on variant
        ``variants[j]`` of its set (:mod:`kope_mcp.runtime.variants`), 0 for the set itself."""

    def read(self, n: int) -> list[dict[str, np.ndarray]]:
        """The candidate's first ``n`` output buffers as the last batch left them (by a path the kernel does not
        control: the caller keeps no reference to the arrays beyond the next batch)."""


@dataclass(frozen=True)
class Schedule:
    time_cap_s: float
    sample_target_s: float = 0.002
    min_rounds: int = 7
    max_rounds: int = 5000
    rel_iqr_goal: float = 0.02
    max_inner: int = 10_000
    ratio_ci_goal: float = 0.015
    noisy_cap_factor: float = 3.0
    checked_variants: int = 2  # variant calls of the candidate judged against the reference (variants.CHECKED)


def median_ci95(values: np.ndarray) -> tuple[float, float]:
    """95% CI of the median from order statistics (no normality assumption); the extremes for tiny n."""
    ordered = np.sort(values)
    n = len(ordered)
    half_width = 1.96 * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half_width) - 1)
    hi = min(n - 1, math.ceil(n / 2 + half_width))
    return float(ordered[lo]), float(ordered[hi])


def ratio_ci_width(slow: list[float], fast: list[float]) -> float:
    """The larger distance of the paired ratios' CI ends from their median, relative to it (inf when there are no
    pairs): what the verdict's speedup is uncertain by."""
    ratios = np.asarray(slow, dtype=np.float64) / np.maximum(np.asarray(fast, dtype=np.float64), 1e-12)
    if not ratios.size:
        return math.inf
    median = float(np.median(ratios))
    lo, hi = median_ci95(ratios)
    return max(median - lo, hi - median) / median if median > 0 else math.inf


def relative_iqr(samples: list[float]) -> float:
    q1, q3 = np.percentile(samples, [25, 75])
    median = float(np.median(samples))
    return float((q3 - q1) / median) if median > 0 else math.inf


def bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or not (a.flags.c_contiguous and b.flags.c_contiguous):
        return False
    word = {8: np.uint64, 4: np.uint32, 2: np.uint16}.get(a.dtype.itemsize, np.uint8)
    return bool(np.array_equal(a.reshape(-1).view(word), b.reshape(-1).view(word)))


class Consistency:
    """Every timed call of a kernel must write all of its fresh outputs and agree with its own first result
    on the same inputs: a kernel that skips work when an output is 'already written', or replays a cached
    result for the wrong inputs, leaves poison or a different answer in some call's buffer. A call on a variant
    of a set (its inputs changed, so no first result to agree with) must leave no poison, and a few of them,
    drawn after the fact, go back to be judged against the reference (``kept_variants``)."""

    def __init__(self, atol: float, rtol: float, unwritten: Callable[[np.ndarray], bool] | None = None,
                 rng: np.random.Generator | None = None) -> None:
        self.atol, self.rtol = atol, rtol
        self.anchor: dict[int, dict[str, np.ndarray]] = {}
        self.bad_calls = 0
        self.first_problem: str | None = None
        self.unwritten = unwritten
        self.rng = rng or np.random.default_rng(int.from_bytes(os.urandom(16), "little"))
        self.kept_variants: list[tuple[int, int, dict[str, np.ndarray]]] = []
        self.variant_calls = 0

    def check_variant(self, set_index: int, variant: int, outputs: dict[str, np.ndarray], call: int,
                      keep: int) -> None:
        """Reservoir-sample ``keep`` variant calls (every one equally likely, whatever the kernel knows)."""
        self.variant_calls += 1
        for name, arr in outputs.items():
            if self.unwritten is not None and self.unwritten(arr):
                self.bad_calls += 1
                if self.first_problem is None:
                    self.first_problem = f"timed call {call} on a variant of input set {set_index}: {name} was not " \
                                         "fully written (poison left)"
                return
        slot = len(self.kept_variants) if len(self.kept_variants) < keep else \
            int(self.rng.integers(self.variant_calls))
        if slot < keep:
            kept = (set_index, variant, {k: v.copy() for k, v in outputs.items()})
            if slot == len(self.kept_variants):
                self.kept_variants.append(kept)
            else:
                self.kept_variants[slot] = kept

    def check(self, set_index: int, outputs: dict[str, np.ndarray], call: int) -> None:
        anchor = self.anchor.get(set_index)
        if anchor is None:
            self.anchor[set_index] = {k: v.copy() for k, v in outputs.items()}
            return
        for name, arr in outputs.items():
            ref = anchor[name]
            if bitwise_equal(arr, ref):
                continue  # the common case, a deterministic kernel: bit for bit, without isclose's temporaries
            if arr.dtype.kind == "f":
                with np.errstate(invalid="ignore", over="ignore"):
                    close = np.isclose(arr, ref, atol=self.atol, rtol=self.rtol, equal_nan=True)
            else:
                close = arr == ref
            if not bool(close.all()):
                self.bad_calls += 1
                if self.first_problem is None:
                    bad = int(np.argmax(~close.reshape(-1)))
                    self.first_problem = (f"timed call {call} on input set {set_index}: {name}[{bad}] = "
                                          f"{arr.reshape(-1)[bad]!r}, the same kernel's first call on these "
                                          f"inputs gave {ref.reshape(-1)[bad]!r}")
                return


class SetStream:
    """Which input set each call of one implementation gets: every set once in a random order, then again in a
    new order; drawn by the protocol and told to the device one batch at a time."""

    def __init__(self, count: int, rng: np.random.Generator) -> None:
        self.count, self.rng = count, rng
        self.pending: list[int] = []
        self.used = 0
        self.repeated = 0

    def take(self, n: int, vary: bool = False) -> tuple[list[int], list[int]]:
        """The next ``n`` sets, and for each the variant to run it on: 0 (the set itself) on its first call, a
        fresh positive id on every later one when ``vary``."""
        chosen: list[int] = []
        variants: list[int] = []
        for _ in range(n):
            if not self.pending:
                self.pending = [int(i) for i in self.rng.permutation(self.count)]
            pick = len(self.pending) - 1
            # With variants, a batch never holds one set twice: a device keeps one copy of a set's inputs per batch.
            while vary and pick >= 0 and self.pending[pick] in chosen:
                pick -= 1
            if pick < 0:
                self.pending = [int(i) for i in self.rng.permutation(self.count)] + self.pending
                pick = next(k for k in range(self.count - 1, -1, -1) if self.pending[k] not in chosen)
            chosen.append(self.pending.pop(pick))
            repeat = self.used >= self.count
            self.repeated += repeat
            variants.append(int(self.rng.integers(1, 1 << 62)) if vary and repeat else 0)
            self.used += 1
        return chosen, variants

    def would_repeat(self, n: int, enforce: bool) -> bool:
        return enforce and self.used + n > self.count


@dataclass
class Measured:
    """What :func:`measure` found: the samples (seconds per call, one list per implementation), and the checks."""

    samples: dict[str, list[float]]
    inner: dict[str, int]
    rounds: int
    seconds: float
    checks: Consistency
    candidate_calls: int
    repeated_calls: int

    @property
    def checked_sets(self) -> list[int]:
        return sorted(self.checks.anchor)

    def variant_outputs(self) -> list[dict[str, np.ndarray]]:
        """The kept variant calls' outputs, in :meth:`result`'s ``checked_variants`` order (after the anchors')."""
        return [outputs for _, _, outputs in self.checks.kept_variants]

    def anchor_outputs(self) -> list[dict[str, np.ndarray]]:
        """The first call's outputs on each set the candidate ran on, in :attr:`checked_sets` order: every later
        call on the same set was checked against them, so they speak for all of it."""
        return [self.checks.anchor[i] for i in self.checked_sets]

    def result(self) -> dict[str, Any]:
        """The fields of a profile's result the workbench reads (``services/verdicts.py``)."""
        return {"checked_sets": self.checked_sets, "candidate_calls": self.candidate_calls,
                "repeated_calls": self.repeated_calls, "inner": self.inner, "rounds": self.rounds,
                "seconds": self.seconds, "inconsistent_calls": self.checks.bad_calls,
                "inconsistency": self.checks.first_problem,
                "checked_variants": [[i, v] for i, v, _ in self.checks.kept_variants],
                "variant_calls": self.checks.variant_calls}


def measure(device: Device, names: list[str], set_count: int, buffers: int, schedule: Schedule,
            checks: Consistency, phase: Callable[[str], None] = lambda _: None) -> Measured:
    """Sample ``names`` (``candidate`` among them) on ``device`` as the module's docstring says. ``buffers`` is
    how many output buffers the candidate has (the most calls one batch may make); ``phase`` is told "warmup"
    and "measure" as they begin."""
    streams = {name: SetStream(set_count, np.random.default_rng(int.from_bytes(os.urandom(16), "little")))
               for name in names}
    vary = bool(getattr(device, "variants", False))

    def sample(name: str, n: int) -> float:
        device.poison(name, n)
        chosen, variants = streams[name].take(n, vary and name != "reference")
        seconds = device.run(name, chosen, variants) if vary else device.run(name, chosen)
        if name == "candidate":
            for j, (index, variant, outputs) in enumerate(zip(chosen, variants, device.read(n), strict=True)):
                if variant:
                    checks.check_variant(index, variant, outputs, j, schedule.checked_variants)
                else:
                    checks.check(index, outputs, j)
        return seconds

    phase("warmup")
    inner: dict[str, int] = {}
    for name in names:
        single = max(sample(name, 1), 1e-7)
        inner[name] = max(1, min(schedule.max_inner, math.ceil(schedule.sample_target_s / single)))
        if name != "reference":
            inner[name] = min(inner[name], buffers, *([set_count] if vary else []))
    samples: dict[str, list[float]] = {name: [] for name in names}
    fresh_rounds = set_count >= inner["candidate"] * (schedule.min_rounds + 1)
    phase("measure")
    start = time.perf_counter()
    rounds = 0
    timed = [k for k in ("candidate", "baseline") if k in samples]

    def precise() -> bool:
        return "baseline" not in samples or ratio_ci_width(samples["baseline"], samples["candidate"]) <= \
            schedule.ratio_ci_goal

    while rounds < schedule.max_rounds:
        for name in names[rounds % len(names):] + names[: rounds % len(names)]:
            samples[name].append(sample(name, inner[name]))
        rounds += 1
        if rounds < schedule.min_rounds:
            continue
        if streams["candidate"].would_repeat(inner["candidate"], fresh_rounds):
            break
        elapsed = time.perf_counter() - start
        if elapsed >= schedule.time_cap_s * schedule.noisy_cap_factor:
            break
        if all(relative_iqr(samples[k]) <= schedule.rel_iqr_goal for k in timed):
            break
        if elapsed >= schedule.time_cap_s and precise():
            break
    return Measured(samples=samples, inner=inner, rounds=rounds, seconds=time.perf_counter() - start,
                    checks=checks, candidate_calls=streams["candidate"].used,
                    repeated_calls=streams["candidate"].repeated)
