"""The scripted agent's repertoire: optimisation strategies as transformations of the current kernel.

Each strategy rewrites the incumbent's C source and/or adds compiler flags, and is tagged with one canonical
strategy name so the memory can pool its outcomes across tasks. The catalogue is honest about reality:

- some help on some families and not others (OpenMP on memory-bound elementwise code vs a 2-core machine);
- some are wrong on some tasks (an OpenMP loop around a scalar accumulator races; a vector loop without a
  scalar tail leaves the last elements unwritten on awkward sizes);
- one does not compile (AVX2 types without <immintrin.h>); its documented fix is the include;
- some are slower or no better than the naive baseline (no vectorisation, unrolling a branchy loop, a
  loop interchange that makes a row-major gemv walk columns, blocking a loop nest that already streams).

The loop-nest rewrites (multiple accumulators, interchange, blocking at 32/64/128) apply only where the kernel
has the loop shape they need (see loops.py), so each family gets its own catalogue: matmul and column sums
can be interchanged, 2-deep nests blocked, `acc += ...` loops split into independent partial sums, while a
plain elementwise loop gets only the generic transformations.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from kope_mcp.bench import loops


@dataclass(frozen=True)
class Kernel:
    source: str
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Strategy:
    name: str
    layer: str
    rationale: str
    apply: Callable[[Kernel], Kernel | None]  # None: does not apply to this kernel
    fix: str | None = None  # the strategy that repairs this one when it fails to compile


def _flags(*added: str) -> Callable[[Kernel], Kernel | None]:
    def apply(k: Kernel) -> Kernel | None:
        sets_level = any(f.startswith("-O") for f in added)
        kept = [f for f in k.flags if not (sets_level and f.startswith("-O"))]
        merged = tuple(dict.fromkeys([*kept, *added]))
        return None if merged == k.flags else Kernel(k.source, merged)
    return apply


_KERNEL_HEAD = re.compile(r"void\s+kernel\s*\(([^)]*)\)", re.S)
_FOR = re.compile(r"^(\s*)for\s*\(", re.M)


def _restrict(k: Kernel) -> Kernel | None:
    match = _KERNEL_HEAD.search(k.source)
    if match is None or "restrict" in match.group(1):
        return None
    params = re.sub(r"\*\s*(\w+)", r"*restrict \1", match.group(1))
    return Kernel(k.source[:match.start(1)] + params + k.source[match.end(1):], k.flags)


def _loop_rewrite(rewrite: Callable[[str, int], str | None]) -> Callable[[Kernel], Kernel | None]:
    def apply(k: Kernel) -> Kernel | None:
        head = _KERNEL_HEAD.search(k.source)
        rewritten = rewrite(k.source, head.end()) if head is not None else None
        return None if rewritten is None else Kernel(rewritten, k.flags)
    return apply


def _body_start(source: str) -> int:
    match = _KERNEL_HEAD.search(source)
    return -1 if match is None else source.find("{", match.end())


def _openmp_outer(k: Kernel) -> Kernel | None:
    start = _body_start(k.source)
    loop = _FOR.search(k.source, start) if start >= 0 else None
    if loop is None or "#pragma omp" in k.source:
        return None
    pragma = f"{loop.group(1)}#pragma omp parallel for\n"
    return Kernel(k.source[:loop.start()] + pragma + k.source[loop.start():], (*k.flags, "-fopenmp"))


def _unroll(k: Kernel) -> Kernel | None:
    start = _body_start(k.source)
    if start < 0 or "#pragma GCC unroll" in k.source:
        return None
    head, body = k.source[:start], k.source[start:]
    body = _FOR.sub(lambda m: f"{m.group(1)}#pragma GCC unroll 4\n{m.group(1)}for (", body)
    return Kernel(head + body, k.flags)


_AVX_HELPER = """
static inline float kope_hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(_mm_hadd_ps(lo, lo));
}
"""


def _avx_without_include(k: Kernel) -> Kernel | None:
    if "__m256" in k.source:
        return None
    start = _KERNEL_HEAD.search(k.source)
    if start is None:
        return None
    return Kernel(k.source[:start.start()] + _AVX_HELPER + "\n" + k.source[start.start():], (*k.flags, "-mavx2"))


def _include_immintrin(k: Kernel) -> Kernel | None:
    if "#include <immintrin.h>" in k.source:
        return None
    return Kernel("#include <immintrin.h>\n" + k.source, k.flags)


_FIRST_BOUND = re.compile(r"for\s*\(\s*int64_t\s+(\w+)\s*=\s*0\s*;\s*\1\s*<\s*(\w+)\s*;")


def _drop_tail(k: Kernel) -> Kernel | None:
    # A hand-vectorised loop that only handles whole vectors of 8: correct only when the size divides by 8.
    start = _body_start(k.source)
    match = _FIRST_BOUND.search(k.source, start) if start >= 0 else None
    if match is None:
        return None
    var, bound = match.group(1), match.group(2)
    new = f"for (int64_t {var} = 0; {var} < ({bound} & ~(int64_t)7);"
    return Kernel(k.source[:match.start()] + new + k.source[match.end():], k.flags)


STRATEGIES: tuple[Strategy, ...] = (
    Strategy("compiler flags -O3", "compiler", "higher optimisation level", _flags("-O3")),
    Strategy("vectorise with -O3 -march=native", "vectorisation",
             "let gcc use the machine's widest vectors", _flags("-O3", "-march=native")),
    Strategy("fast math", "compiler", "allow reassociation so reductions and math calls vectorise",
             _flags("-O3", "-ffast-math")),
    Strategy("restrict pointers", "memory", "promise no aliasing so loads can be hoisted and vectorised",
             _restrict),
    Strategy("OpenMP over the outer loop", "parallelism", "use every core on independent iterations",
             _openmp_outer),
    Strategy("unroll by 4", "compiler", "fewer loop branches, more independent work per iteration", _unroll),
    Strategy("AVX2 horizontal-sum helper", "vectorisation", "hand-written AVX2 reduction helper",
             _avx_without_include, fix="include immintrin.h"),
    Strategy("include immintrin.h", "vectorisation", "the intrinsics need their header", _include_immintrin),
    Strategy("vector loop without tail", "vectorisation", "process whole vectors of 8 only", _drop_tail),
    Strategy("multiple accumulators", "compute",
             "four independent partial sums break the floating-point add chain so the adder pipelines",
             _loop_rewrite(loops.multiple_accumulators)),
    Strategy("loop interchange", "memory",
             "move the reduction loop outside so the inner loop walks memory contiguously",
             _loop_rewrite(loops.interchange)),
    *(Strategy(f"blocking {tile}", "memory", f"tile two nested loops in {tile}x{tile} blocks so the working "
               "set stays in cache", _loop_rewrite(functools.partial(loops.block, tile=tile)))
      for tile in (32, 64, 128)),
    Strategy("disable vectorisation", "compiler", "scalar code is sometimes faster for short loops",
             _flags("-O2", "-fno-tree-vectorize")),
)
BY_NAME = {s.name: s for s in STRATEGIES}
# What an agent may try on its own initiative (a fix is tried only after the failure it repairs).
CHOICES: tuple[str, ...] = tuple(s.name for s in STRATEGIES if s.name != "include immintrin.h")


def applicable(source: str) -> list[str]:
    """The strategies an agent could try first on this kernel (those whose rewrite fits its shape)."""
    return [name for name in CHOICES if BY_NAME[name].apply(Kernel(source)) is not None]
