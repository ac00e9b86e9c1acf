"""Corroborate the harness's timings with the timekeeper's stamps; refuse what cannot be corroborated.

The harness's worker for each implementation writes ``B <impl>`` before every timed batch and waits for the
timekeeper's acknowledgement, then reads ``CLOCK_MONOTONIC`` (t0), makes its calls, reads it again (t1) and
writes ``E <impl> <calls> <t0> <t1>``; ``M`` marks the end of the warm-up. The timekeeper, a trusted process
outside the sandbox, prefixes each line with the monotonic time it arrived. A kernel shares its worker's process
and could write anything into the pipe while it runs (the other workers are stopped then), so:

- the stream must be exactly the protocol (B and E alternate, same implementation, sane numbers), and the
  measured batches must follow the harness's schedule exactly: every round times each implementation once, in
  the order rotated by one per round (a kernel that slips in an extra, empty batch of its own breaks it);
- every claimed interval must lie inside its stamped one (``stamp(B) <= t0 <= t1 <= stamp(E)``): the
  acknowledgement makes this hold for any honest batch however late the timekeeper was scheduled, so a claim
  outside it is a forgery (the baseline made to look slower than it ran, say);
- the part of the stamped window the candidate's claims leave out (wake-ups and pipe writes) must be about what
  the least of the interleaved implementations leaves out: a kernel that claims to start later or end earlier
  than it did leaves out more. The difference of the medians may not exceed 3% of the candidate's median batch
  or 0.25 ms, whichever is larger; that is all a forger can gain. (Measured here: 50-130 µs left out, medians
  within 70 µs of each other, with both CPUs busy too, because the timekeeper shares the kernel's CPU.) Only the
  candidate is held to it: the baseline's and the reference's workers run no kernel code and are stopped while
  the kernel runs, so their lines are not the kernel's to write; with another process streaming memory the
  numpy reference left out 0.56-0.67 ms against 0.14-0.19 ms for the others, which refused honest kernels.

When the candidate leaves out more than that, the measurement is not refused (a busy machine does it to honest
kernels: 4.65 ms of a 142 ms batch at load 3 on 2 cores): each of its batches is charged its stamped window less
what the trusted implementations leave out, ``claimed + max(0, left_out - least)``, which is never less than what
it ran, and the result says so (``conservative``). A forger's short claims then buy nothing. Only a stream that
breaks the protocol (a claim outside its stamps, a batch out of schedule) is refused.

The samples reported are the harness's own clock readings, once corroborated, or the conservative charge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

RELATIVE_TOLERANCE = 0.03
ABSOLUTE_TOLERANCE_S = 250e-6


class TimingUnverified(Exception):
    """The stamps do not corroborate the harness's claims."""


@dataclass
class Batch:
    impl: str
    calls: int
    claimed_s: float
    left_out_s: float  # the stamped window minus the claim


@dataclass
class CorroboratedTimings:
    samples: dict[str, list[float]] = field(default_factory=dict)  # seconds per call, one per batch
    inner: dict[str, int] = field(default_factory=dict)
    conservative: str = ""  # why the candidate was charged its stamped windows instead of its claims


def parse_stamps(text: str, impls: list[str]) -> list[Batch]:
    """The measured batches (after ``M``); raises TimingUnverified when the stream breaks the protocol."""
    batches: list[Batch] = []
    open_batch: tuple[str, int] | None = None
    measuring = False
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if len(parts) < 2 or not parts[0].isdigit():
            raise TimingUnverified(f"line {number} of the timing stream is not a stamped marker")
        stamp, kind = int(parts[0]), parts[1]
        if kind == "M" and len(parts) == 2 and open_batch is None and not measuring:
            measuring = True
        elif kind == "B" and len(parts) == 3 and parts[2] in impls and open_batch is None:
            open_batch = (parts[2], stamp)
        elif kind == "E" and len(parts) == 6 and open_batch is not None and parts[2] == open_batch[0]:
            try:
                calls, t0, t1 = int(parts[3]), int(parts[4]), int(parts[5])
            except ValueError as exc:
                raise TimingUnverified(f"line {number}: malformed batch end") from exc
            if calls < 1 or not open_batch[1] <= t0 <= t1 <= stamp:
                raise TimingUnverified(f"line {number}: a batch of {parts[2]!r} claims an interval outside the "
                                       "one the timekeeper stamped")
            if measuring:
                stamped = stamp - open_batch[1]
                batches.append(Batch(open_batch[0], calls, (t1 - t0) / 1e9, (stamped - (t1 - t0)) / 1e9))
            open_batch = None
        else:
            raise TimingUnverified(f"line {number} of the timing stream breaks the protocol: {line[:80]!r}")
    if open_batch is not None:
        raise TimingUnverified("the timing stream ends inside a batch")
    return batches


def schedule(order: list[str], rounds: int) -> list[str]:
    """The implementation timed at each batch: every round rotates the order by one."""
    return [name for r in range(rounds) for name in order[r % len(order):] + order[: r % len(order)]]


def corroborate(batches: list[Batch], order: list[str], untrusted: str = "candidate") -> CorroboratedTimings:
    """``order``: the implementations in the harness's order (candidate, baseline?, reference?); ``untrusted``:
    the one whose process runs the kernel's code, the only one that could have written forged lines."""
    rounds, extra = divmod(len(batches), len(order))
    if rounds == 0 or extra or [b.impl for b in batches] != schedule(order, rounds):
        raise TimingUnverified("the timed batches do not follow the harness's schedule")
    result = CorroboratedTimings()
    left_out = {impl: float(np.median([b.left_out_s for b in batches if b.impl == impl])) for impl in order}
    least = min(left_out.values())
    for impl in order:
        mine = [b for b in batches if b.impl == impl]
        if len({b.calls for b in mine}) != 1:
            raise TimingUnverified(f"{impl!r} changed its calls per batch during the measurement")
        claimed = float(np.median([b.claimed_s for b in mine]))
        if impl == untrusted and left_out[impl] - least > max(RELATIVE_TOLERANCE * claimed, ABSOLUTE_TOLERANCE_S):
            result.conservative = (
                f"its claims left {left_out[impl] * 1e3:.3f} ms of the stamped batch unaccounted for (median), "
                f"against {least * 1e3:.3f} ms for the others (median claimed batch {claimed * 1e3:.3f} ms)")
            result.samples[impl] = [(b.claimed_s + max(0.0, b.left_out_s - least)) / b.calls for b in mine]
        else:
            result.samples[impl] = [b.claimed_s / b.calls for b in mine]
        result.inner[impl] = mine[0].calls
    return result
