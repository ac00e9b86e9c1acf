"""The compiler-flag allow-list: options that change code generation only.

Anything that could read or write arbitrary files (``-o``, ``@file``, ``-B``, ``-specs``, ``-fplugin``,
``-fdump-*``, ``-fprofile-*``, ``-Wl,``, an ``-I`` outside the build directory, ...) is refused with a
``refused_flag`` error that lists what is allowed.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from kope_mcp.errors import RefusedFlagError

ALLOWED_SUMMARY = (
    "-O0/-O1/-O2/-O3/-Os/-Ofast/-Og; -march=CPU, -mtune=CPU; ISA switches such as -mavx2, -mfma, -mavx512f, "
    "-mno-avx512f, -mprefer-vector-width=256; codegen -f options such as -funroll-loops, -ffast-math, "
    "-fno-math-errno, -ftree-vectorize, -fopenmp, -fopenmp-simd, -fno-trapping-math, -fvect-cost-model=...; "
    "-DNAME or -DNAME=VALUE; -std=c99/c11/c17/gnu11/gnu17/c2x/gnu2x; -W warnings (not -Wl,/-Wa,/-Wp,); -g; "
    "-I with a relative path inside the build directory"
)

_SIMPLE = re.compile(
    r"^(?:-O[0-3sg]?|-Ofast|-g[0-3]?|-std=(?:c|gnu)(?:99|11|17|18|2x|23)|-pthread"
    r"|-m(?:arch|tune)=[A-Za-z0-9_.\-]+"
    r"|-m(?:no-)?(?:sse[0-9.a-z]*|ssse3|avx[0-9a-z_]*|fma4?|f16c|bmi2?|popcnt|lzcnt|movbe|prfchw|aes|pclmul|"
    r"vpclmulqdq|gfni|amx-[a-z0-9]+|neon|sve2?|simd128|relaxed-simd)"
    r"|-mprefer-vector-width=(?:128|256|512|none)"
    r"|-W(?!l,|a,|p,)[A-Za-z0-9=\-+]+"
    r"|-D[A-Za-z_][A-Za-z0-9_]*(?:=[A-Za-z0-9_.+\-]*)?"
    r"|-U[A-Za-z_][A-Za-z0-9_]*)$"
)

# -f options that only change how code is generated (each also allowed as -fno-NAME).
_CODEGEN_F = {
    "fast-math", "unsafe-math-optimizations", "associative-math", "reciprocal-math", "finite-math-only",
    "math-errno", "signed-zeros", "trapping-math", "rounding-math", "fp-contract", "excess-precision",
    "unroll-loops", "unroll-all-loops", "peel-loops", "tree-vectorize", "tree-loop-vectorize",
    "tree-slp-vectorize", "vect-cost-model", "simd-cost-model", "prefetch-loop-arrays", "omit-frame-pointer",
    "strict-aliasing", "openmp", "openmp-simd", "inline", "inline-functions", "inline-small-functions",
    "ipa-pta", "gcse", "gcse-after-reload", "loop-interchange", "loop-unroll-and-jam", "tree-loop-distribution",
    "tree-loop-distribute-patterns", "split-loops", "unswitch-loops", "version-loops-for-strides",
    "ivopts", "tree-pre", "tree-partial-pre", "schedule-insns", "schedule-insns2", "sched-pressure",
    "align-functions", "align-loops", "align-jumps", "align-labels", "branch-probabilities", "wrapv",
    "strict-overflow", "cx-limited-range", "single-precision-constant", "builtin", "stack-protector",
    "PIC", "pic", "PIE", "pie", "common", "optimize-sibling-calls", "predictive-commoning", "tree-loop-im",
    "move-loop-invariants", "graphite", "graphite-identity", "loop-nest-optimize", "semantic-interposition",
    "plt", "lto", "whole-program", "diagnostics-color", "diagnostics-show-caret", "max-errors",
}
_F_OPTION = re.compile(r"^-f(?P<no>no-)?(?P<name>[A-Za-z0-9\-]+?)(?:=(?P<value>[A-Za-z0-9_.,:\-]+))?$")


def validate_flags(flags: list[str]) -> list[str]:
    """Return the flags unchanged when every one is allowed; raise RefusedFlagError on the first that is not."""
    for flag in flags:
        _check(flag)
    return list(flags)


def _check(flag: str) -> None:
    if not isinstance(flag, str) or not flag:
        raise RefusedFlagError(repr(flag), "an empty flag", ALLOWED_SUMMARY)
    if any(c.isspace() for c in flag):
        raise RefusedFlagError(flag, "one flag per list item, without spaces", ALLOWED_SUMMARY)
    if flag.startswith("@"):
        raise RefusedFlagError(flag, "response files read arbitrary files", ALLOWED_SUMMARY)
    if not flag.startswith("-"):
        raise RefusedFlagError(flag, "extra input files are not accepted: send the kernel as `source`", ALLOWED_SUMMARY)
    if flag.startswith("-I"):
        _check_include_dir(flag)
        return
    if _SIMPLE.fullmatch(flag):
        return
    m = _F_OPTION.fullmatch(flag)
    if m and m.group("name") in _CODEGEN_F:
        return
    raise RefusedFlagError(flag, _reason(flag), ALLOWED_SUMMARY)


def _check_include_dir(flag: str) -> None:
    path = flag[2:]
    if not path:
        raise RefusedFlagError(flag, "write the directory in the same item, e.g. -Iinclude", ALLOWED_SUMMARY)
    parts = PurePosixPath(path).parts
    if PurePosixPath(path).is_absolute() or ".." in parts or path.startswith("~"):
        raise RefusedFlagError(flag, "-I may only name a relative path inside the build directory", ALLOWED_SUMMARY)


def _reason(flag: str) -> str:
    if flag in ("-o", "-x", "-c", "-S", "-E", "-shared", "-static") or flag.startswith(("-o", "-x")):
        return "the server chooses outputs and languages itself"
    if flag.startswith(("-B", "-specs", "--specs", "-isystem", "-iquote", "-idirafter", "-include", "-imacros",
                        "-L", "--sysroot", "-isysroot", "-wrapper")):
        return "it can make the compiler read arbitrary files or run other programs"
    if flag.startswith(("-Wl,", "-Wa,", "-Wp,", "-Xlinker", "-Xassembler", "-Xpreprocessor")):
        return "it passes options to the linker, assembler or preprocessor"
    if flag.startswith(("-fplugin", "-fdump", "-fprofile", "-fauto-profile", "-fdebug-prefix", "-ffile-prefix",
                        "-fsave", "-fcompare-debug", "-fstack-usage", "-fcallgraph-info", "-fopt-info",
                        "-fsanitize", "-finstrument", "-fcoverage", "-frecord")):
        return "it loads plugins, writes files or changes the runtime"
    if flag.startswith("-l"):
        return "only libm is linked (it is always linked)"
    if flag.startswith("-f"):
        return "not a known code-generation -f option"
    return "not on the allow-list"
