"""Load one task folder (task.toml, reference.py, optionally baseline.c) into a runnable ``Task``."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from pydantic import ValidationError

from kope_mcp.errors import InvalidTaskError
from kope_mcp.tasks.expr import ExpressionError
from kope_mcp.tasks.spec import ArgSpec, CaseSpec, TaskSpec, ValueRange
from kope_mcp.tasks.structure import MIN_ELEMENTS, place_outliers, sparsify, support

TASK_FILE = "task.toml"
REFERENCE_FILE = "reference.py"
BASELINE_FILE = "baseline.c"


@dataclass(frozen=True)
class Task:
    spec: TaskSpec
    folder: Path
    reference_source: str
    baseline_source: str | None  # None: speedups are measured against the reference itself
    # None for a task folder that is not part of the package: its reference.py is someone else's code and runs
    # only in the sandbox (services/references.py), never imported by the server.
    reference_fn: Callable[..., Any] | None
    generate_fn: Callable[..., dict[str, np.ndarray]] | None
    trusted: bool = True

    @property
    def id(self) -> str:
        return self.spec.id

    def case_seed(self, case: CaseSpec, repeat: int = 0) -> int:
        digest = hashlib.sha256(f"{self.id}/{case.name}/{repeat}".encode()).digest()
        return int.from_bytes(digest[:4], "little")

    def make_inputs(self, sizes: dict[str, int], seed: int,
                    ranges: dict[str, ValueRange] | None = None, outliers: int = 0,
                    outlier_magnitude: float | None = None, sparse: int = 0) -> dict[str, np.ndarray]:
        """Seeded inputs for every ``in`` argument (the task's own generator when it has one); ``ranges`` (a
        case's) replace an argument's own [low, high); ``sparse`` and ``outliers`` (a case's) are structure.py's."""
        if not self.trusted:
            raise RuntimeError(f"task {self.id!r} is not the package's: its inputs are made in the sandbox")
        ranges = ranges or {}
        rng = np.random.default_rng(seed)
        inputs: dict[str, np.ndarray] = {}
        drawn: list[tuple[np.ndarray, float, float]] = []
        if self.generate_fn is not None:
            inputs = {k: np.ascontiguousarray(v) for k, v in self.generate_fn(rng, **sizes).items()}
        for arg in self.spec.args:
            if arg.kind != "in":
                continue
            shape = self.spec.shape_of(arg, sizes)
            if arg.name in inputs:
                arr = inputs[arg.name]
                if arr.shape != shape or arr.dtype != np.dtype(arg.dtype):
                    raise InvalidTaskError(
                        f"{self.folder / REFERENCE_FILE}: generate() gave {arg.name!r} shape {arr.shape} dtype "
                        f"{arr.dtype}; task.toml says shape {shape} dtype {arg.dtype}"
                    )
                continue
            low, high = (ranges[arg.name].low, ranges[arg.name].high) if arg.name in ranges else (arg.low, arg.high)
            if arg.dtype.startswith("float"):
                arr = rng.uniform(low, high, size=shape).astype(arg.dtype)
            else:
                arr = rng.integers(int(low), int(high), size=shape, dtype=arg.dtype)
            inputs[arg.name] = np.ascontiguousarray(arr)
            if arr.dtype.kind == "f":
                drawn.append((inputs[arg.name], low, high))
        self._structure(drawn, rng, outliers, outlier_magnitude, sparse)
        return inputs

    @staticmethod
    def _structure(drawn: list[tuple[np.ndarray, float, float]], rng: np.random.Generator, outliers: int,
                   magnitude: float | None, sparse: int) -> None:
        """The sparse support and the outliers of structure.py, on the float inputs drawn from a range."""
        large = [entry for entry in drawn if entry[0].size >= MIN_ELEMENTS]
        if not large:
            return
        first, low, high = large[0]
        kept = support(first.size, sparse, rng)
        if kept is not None:
            # One support for every input of the first one's shape: a difference of two inputs is zero off it.
            sparsify([arr for arr, _, _ in large if arr.shape == first.shape], kept)
        if outliers:
            # In the first float input only: outliers in two inputs could cancel in a difference.
            sign = 1.0 if low >= 0 else -1.0 if high <= 0 else None
            place_outliers(first, outliers, max(abs(low), abs(high)), rng, magnitude, kept, sign)

    def case_inputs(self, case: CaseSpec, seed: int) -> dict[str, np.ndarray]:
        """The inputs of one run of ``case`` (its sizes, value ranges, sparse support and outliers)."""
        return self.make_inputs(case.sizes, seed, case.ranges, case.outliers, case.outlier_magnitude, case.sparse)

    def call_arguments(self, inputs: dict[str, np.ndarray], sizes: dict[str, int]) -> dict[str, Any]:
        """Keyword arguments for ``reference``: every argument that is not an output."""
        kwargs: dict[str, Any] = {}
        for arg in self.spec.args:
            if arg.kind == "in":
                kwargs[arg.name] = inputs[arg.name]
            elif arg.kind == "size":
                kwargs[arg.name] = sizes[arg.name]
            elif arg.kind == "scalar":
                kwargs[arg.name] = np.float32(arg.value) if arg.dtype == "float32" else arg.value
        return kwargs

    def run_reference(self, inputs: dict[str, np.ndarray], sizes: dict[str, int]) -> list[np.ndarray]:
        """The expected outputs, in prototype order, as float64 arrays of the declared shapes."""
        if self.reference_fn is None:
            raise RuntimeError(f"task {self.id!r} is not the package's: its reference runs only in the sandbox")
        result = self.reference_fn(**self.call_arguments(inputs, sizes))
        outs = [a for a in self.spec.args if a.kind == "out"]
        values = list(result) if isinstance(result, tuple | list) else [result]
        if len(values) != len(outs):
            raise InvalidTaskError(
                f"{self.folder / REFERENCE_FILE}: reference() returned {len(values)} arrays; "
                f"the task has {len(outs)} outputs ({', '.join(a.name for a in outs)})"
            )
        expected: list[np.ndarray] = []
        for arg, value in zip(outs, values, strict=True):
            arr = np.asarray(value, dtype=np.float64)
            shape = self.spec.shape_of(arg, sizes)
            if arr.size != int(np.prod(shape)):
                raise InvalidTaskError(
                    f"{self.folder / REFERENCE_FILE}: reference() output {arg.name!r} has {arr.size} elements; "
                    f"task.toml says shape {shape}"
                )
            expected.append(arr.reshape(shape))
        return expected

    def outputs(self) -> list[ArgSpec]:
        return [a for a in self.spec.args if a.kind == "out"]


def _load_module(path: Path, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise InvalidTaskError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a user's task file may raise anything on import; report it, do not crash
        raise InvalidTaskError(f"{path}: importing it raised {type(exc).__name__}: {exc}") from None
    return module


def _describe_validation(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        parts.append(f"field {where}: {item['msg']}")
    return "; ".join(parts)


def load_task(folder: Path, *, trusted: bool = True) -> Task:
    """Load and validate one task folder; raises InvalidTaskError naming the file and field at fault.

    ``trusted=False`` (every folder but the package's suite): task.toml is read, reference.py is not imported;
    its checks (the signature of ``reference``, what it returns) happen in the sandbox when it first runs."""
    for name in (TASK_FILE, REFERENCE_FILE):
        if not (folder / name).is_file():
            raise InvalidTaskError(f"{folder}: missing {name} (a task folder holds {TASK_FILE}, "
                                   f"{REFERENCE_FILE} and optionally {BASELINE_FILE})")
    toml_path = folder / TASK_FILE
    try:
        raw = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise InvalidTaskError(f"{toml_path}: not valid TOML: {exc}") from None
    try:
        spec = TaskSpec.model_validate(raw)
    except ValidationError as exc:
        raise InvalidTaskError(f"{toml_path}: {_describe_validation(exc)}") from None
    except ExpressionError as exc:
        raise InvalidTaskError(f"{toml_path}: {exc}") from None
    reference_source = (folder / REFERENCE_FILE).read_text(encoding="utf-8")
    baseline_source = ((folder / BASELINE_FILE).read_text(encoding="utf-8") if (folder / BASELINE_FILE).is_file()
                       else None)
    if not trusted:
        return Task(spec=spec, folder=folder, reference_source=reference_source, baseline_source=baseline_source,
                    reference_fn=None, generate_fn=None, trusted=False)
    module = _load_module(folder / REFERENCE_FILE, f"kope_task_{spec.id.replace('-', '_')}")
    reference_fn = getattr(module, "reference", None)
    if not callable(reference_fn):
        raise InvalidTaskError(f"{folder / REFERENCE_FILE}: must define reference(...)")
    params = set(inspect.signature(reference_fn).parameters)
    wanted = {a.name for a in spec.args if a.kind != "out"}
    if params != wanted:
        raise InvalidTaskError(
            f"{folder / REFERENCE_FILE}: reference() takes {sorted(params)}; it must take exactly the "
            f"non-output arguments {sorted(wanted)}"
        )
    generate_fn = getattr(module, "generate", None)
    return Task(
        spec=spec,
        folder=folder,
        reference_source=reference_source,
        baseline_source=baseline_source,
        reference_fn=reference_fn,
        generate_fn=generate_fn if callable(generate_fn) else None,
    )
