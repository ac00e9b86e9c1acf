"""The task format: what a kernel must compute, how it is checked, and how it is measured.

A task is a folder with three files:

- ``task.toml``: id, family, level, description, the kernel's arguments (from which the C prototype is derived),
  correctness cases, a profiling case, tolerances, FLOP and byte counts;
- ``reference.py``: ``reference(**args)`` in numpy returns the outputs; optional ``generate(rng, **sizes)``
  returns custom inputs;
- ``baseline.c`` (optional): a naive, correct C kernel that speedups are measured against; without one (a
  KernelBench import), speedups are measured against the reference itself, as KernelBench measures against PyTorch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kope_mcp.tasks.expr import evaluate, names_in

Family = Literal[
    "elementwise",
    "activation",
    "reduction",
    "normalization",
    "matmul",
    "convolution",
    "pooling",
    "scan",
    "data-movement",
    "loss",
    "attention",
]
DType = Literal["float32", "float64", "int32", "int64"]

C_TYPES: dict[str, str] = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t"}

DEFAULT_RULES: tuple[str, ...] = (
    "Define exactly one function with the prototype above, named `kernel`; helper functions must be `static`.",
    "C17 (GNU dialect) compiled by gcc with -O2 -fPIC -shared plus the flags you pass; <math.h>, <stdint.h>, "
    "<string.h>, <immintrin.h> and <omp.h> are available; libm is linked.",
    "Arrays are float32, row-major, contiguous, and may be of any size including 1: handle every tail.",
    "Do not modify inputs; write every element of every output (outputs start filled with NaN poison).",
    "OpenMP is allowed when you pass -fopenmp; the kernel then runs on all cores and profile_kernel says so.",
    "No files, sockets, processes or global state that survives between calls: the kernel runs in a sandbox.",
)


class ArgSpec(BaseModel):
    """One argument of ``kernel``, in prototype order."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    kind: Literal["in", "out", "size", "scalar"]
    dtype: DType = "float32"
    shape: list[str | int] = Field(default_factory=list, description="Extent expressions over the sizes.")
    low: float = Field(-1.0, description="Generated inputs are uniform in [low, high).")
    high: float = 1.0
    value: float | None = Field(None, description="The value of a scalar argument.")
    doc: str = ""

    @model_validator(mode="after")
    def _check_kind(self) -> ArgSpec:
        if self.kind in ("in", "out") and not self.shape:
            raise ValueError(f"argument {self.name!r}: an {self.kind!r} array needs a shape")
        if self.kind == "scalar" and self.value is None:
            raise ValueError(f"argument {self.name!r}: a scalar needs a value")
        if self.kind == "size" and self.dtype != "int64":
            raise ValueError(f"argument {self.name!r}: sizes are int64")
        return self

    @property
    def is_pointer(self) -> bool:
        return self.kind in ("in", "out")

    def c_declaration(self) -> str:
        ctype = C_TYPES[self.dtype]
        if self.kind == "in":
            return f"const {ctype} *{self.name}"
        if self.kind == "out":
            return f"{ctype} *{self.name}"
        return f"{ctype} {self.name}"


class Tolerance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    atol: float = Field(ge=0)
    rtol: float = Field(ge=0)


class ValueRange(BaseModel):
    """Inputs of one argument drawn uniform in [low, high) for this case instead of the argument's own range."""

    model_config = ConfigDict(extra="forbid")

    low: float
    high: float

    @model_validator(mode="after")
    def _ordered(self) -> ValueRange:
        if not self.low < self.high:
            raise ValueError(f"an input range needs low < high (got [{self.low}, {self.high}))")
        return self


class CaseSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    sizes: dict[str, int]
    note: str = ""
    ranges: dict[str, ValueRange] = Field(default_factory=dict, description="Per-input value ranges for this case: "
                                          "values that break a naive formula (exp overflow, a large mean).")
    tolerance: dict[DType, Tolerance] | None = Field(None, description="This case's tolerance, when it differs "
                                                      "from the task's (a float32 sum over 16M elements).")
    variants: bool = Field(True, description="A profile at this size times repeated calls on variants of their "
                           "input sets (runtime/variants.py). False where an honest float32 kernel's accuracy "
                           "depends on the inputs' exact distribution: a serial sum of 16M uniform [0, 1) values "
                           "rounds without bias, of the same values scaled by 0.5-1x 2% low.")
    outliers: int = Field(0, ge=0, le=64, description="Float inputs of at least 1,024 elements carry this many "
                          "outliers at random positions (see tasks/structure.py): a kernel that reads a subsample "
                          "misses some of them and is wrong by far more than the tolerance.")
    outlier_magnitude: float | None = Field(None, gt=0, description="Their typical magnitude (each is drawn within "
                                            "a factor 2 of it); default: the input's range x sqrt(elements / "
                                            "outliers), about half of a sum of squares (elements: those of the "
                                            "sparse support when there is one).")
    sparse: int = Field(0, ge=0, le=1 << 20, description="Float inputs of at least 1,024 elements hold a value in "
                        "one element of `sparse`, at random positions shared by every float input of that shape, "
                        "and exactly zero elsewhere (see tasks/structure.py): an honest float32 sum over millions "
                        "of elements stays within the task's own tolerance, a subsample does not. 0: dense.")


class TaskSpec(BaseModel):
    """Everything a model needs to write the kernel, and everything the server needs to check it."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    family: Family
    level: int = Field(ge=1, le=4)
    summary: str = Field(max_length=160, description="One line for the catalogue.")
    description: str
    args: list[ArgSpec]
    cases: list[CaseSpec] = Field(min_length=5)
    profile: CaseSpec
    profile_gpu: CaseSpec | None = Field(None, description="The profiling size on a GPU (one that takes the naive "
                                         "baseline about a millisecond or moves at least 4x the L2): a CPU size "
                                         "would time launch overhead there. Absent: the CPU size applies.")
    tolerance: dict[DType, Tolerance]
    flops: str | int
    bytes: str | int
    openmp_allowed: bool = True
    drawn_cases: bool = Field(True, description="The sizes are independent of each other, so run_tests may draw a "
                              "case near the profiling size each run (see tasks/drawn.py).")
    rules: list[str] = Field(default_factory=list, description="Task-specific rules, after the default ones.")

    @model_validator(mode="after")
    def _check_consistency(self) -> TaskSpec:
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise ValueError("argument names must be unique")
        if not any(a.kind == "out" for a in self.args):
            raise ValueError("a task needs at least one 'out' argument")
        size_names = {a.name for a in self.args if a.kind == "size"}
        for arg in self.args:
            for extent in arg.shape:
                if isinstance(extent, str) and not names_in(extent) <= size_names:
                    raise ValueError(f"shape of {arg.name!r} uses {sorted(names_in(extent) - size_names)}")
        for expr_name, expr in (("flops", self.flops), ("bytes", self.bytes)):
            if isinstance(expr, str) and not names_in(expr) <= size_names:
                raise ValueError(f"{expr_name} uses {sorted(names_in(expr) - size_names)}, which are not sizes")
        for case in [*self.cases, self.profile, *([self.profile_gpu] if self.profile_gpu else [])]:
            if set(case.sizes) != size_names:
                raise ValueError(f"case {case.name!r} must give exactly the sizes {sorted(size_names)}")
            if any(v < 1 for v in case.sizes.values()):
                raise ValueError(f"case {case.name!r}: sizes must be >= 1")
            unknown = set(case.ranges) - {a.name for a in self.args if a.kind == "in"}
            if unknown:
                raise ValueError(f"case {case.name!r}: ranges name {sorted(unknown)}, which are not inputs")
        for arg in self.args:
            if arg.dtype not in self.tolerance and arg.kind == "out":
                raise ValueError(f"no tolerance for dtype {arg.dtype} of output {arg.name!r}")
        return self

    def profile_for(self, device_class: str) -> CaseSpec:
        """The profiling case of a device class ("cpu" or "gpu")."""
        return self.profile_gpu if device_class == "gpu" and self.profile_gpu is not None else self.profile

    def tolerance_for(self, case: CaseSpec) -> dict[str, Tolerance]:
        """Per output dtype: the case's own tolerance where it has one, else the task's."""
        return {str(dtype): tol for dtype, tol in {**self.tolerance, **(case.tolerance or {})}.items()}

    @property
    def prototype(self) -> str:
        return f"void kernel({', '.join(a.c_declaration() for a in self.args)})"

    @property
    def size_names(self) -> list[str]:
        return [a.name for a in self.args if a.kind == "size"]

    def shape_of(self, arg: ArgSpec, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(evaluate(e, sizes) for e in arg.shape)

    def flop_count(self, sizes: dict[str, int]) -> int:
        return evaluate(self.flops, sizes)

    def byte_count(self, sizes: dict[str, int]) -> int:
        return evaluate(self.bytes, sizes)

    def all_rules(self) -> list[str]:
        rules = list(DEFAULT_RULES)
        if not self.openmp_allowed:
            rules[4] = "OpenMP is not allowed for this task: the kernel must be single-threaded."
        return rules + self.rules
