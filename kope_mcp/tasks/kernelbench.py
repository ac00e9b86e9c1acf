"""A KernelBench-format problem (a PyTorch ``Model``, ``get_inputs()``, ``get_init_inputs()``) as a task reference.

The problem file is kept verbatim next to the task (``problem.py``). Its module-level integers (``M = 4096``,
``batch_size = 16``, ``kernel_size = 3``) are the sizes: setting them and calling ``get_inputs()`` and
``get_init_inputs()`` again gives the problem at another size. The model's floating-point parameters and
buffers become extra inputs of the C kernel, so a kernel sees exactly the weights the reference used.

torch is imported lazily: loading the task catalogue must not pay for it.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

import numpy as np

PROBLEM_FILE = "problem.py"
_DTYPES = {"torch.float32": "float32", "torch.int64": "int64"}


class ProblemError(ValueError):
    """The problem cannot be expressed as a C task (the message says why)."""


@dataclass(frozen=True)
class TensorSlot:
    """One array argument of the kernel: a forward input, a model parameter/buffer, or the output."""

    name: str
    role: str  # "input" | "param" | "output"
    shape: tuple[int, ...]
    dtype: str
    key: str = ""  # the state_dict key of a parameter


@dataclass(frozen=True)
class ProblemTrace:
    inputs: list[TensorSlot]
    params: list[TensorSlot]
    output: TensorSlot

    @property
    def slots(self) -> list[TensorSlot]:
        return [*self.inputs, *self.params, self.output]

    def elements(self) -> int:
        return sum(int(np.prod(s.shape)) for s in self.slots)


def c_identifier(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", text).strip("_") or "t"
    return name if not name[0].isdigit() else f"t_{name}"


_OVERRIDES = "__kope_sizes__"


def _with_size_overrides(source: str, path: Path) -> CodeType:
    """Compile the problem so that every top-level assignment to a name is followed by
    ``name = __kope_sizes__.get("name", name)``: values derived from a size further down the file
    (``bias_shape = (out_channels, 1, 1)``) then follow the size, which setting the attribute afterwards would miss.
    """
    tree = ast.parse(source, filename=str(path))
    body: list[ast.stmt] = []
    for stmt in tree.body:
        body.append(stmt)
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
            stmt, ast.AnnAssign) else []
        names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
        for name in names:
            body.append(ast.parse(f"{name} = {_OVERRIDES}.get({name!r}, {name})").body[0])
    tree.body = body
    return compile(ast.fix_missing_locations(tree), str(path), "exec")


class KernelBenchProblem:
    """One problem file, executed once per set of sizes (a fresh module each, so nothing is shared between
    threads but torch's global seed, which a lock guards)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.source = path.read_text(encoding="utf-8")
        try:
            self._code = _with_size_overrides(self.source, path)
        except SyntaxError as exc:
            raise ProblemError(f"not valid Python: {exc.msg} (line {exc.lineno})") from None
        self._modules: dict[tuple[tuple[str, int], ...], ModuleType] = {}
        self._models: dict[tuple[tuple[tuple[str, int], ...], bool], Any] = {}
        self._lock = threading.RLock()

    # --- loading ---------------------------------------------------------------------------------------
    def module(self, sizes: Mapping[str, int] | None = None) -> ModuleType:
        key = tuple(sorted((k, int(v)) for k, v in (sizes or {}).items()))
        with self._lock:
            if key not in self._modules:
                if len(self._modules) > 64:
                    self._modules.clear()
                self._modules[key] = self._execute(dict(key))
            return self._modules[key]

    def _execute(self, sizes: dict[str, int]) -> ModuleType:
        import torch  # noqa: F401  (the problem file imports it too; fail here with a clear error if absent)

        digest = hashlib.sha256(self.source.encode()).hexdigest()[:12]
        module = ModuleType(f"kope_kernelbench_{digest}")
        module.__file__ = str(self.path)
        module.__dict__[_OVERRIDES] = sizes
        try:
            exec(self._code, module.__dict__)
        except Exception as exc:  # a problem file may raise anything at import; report it, do not crash
            raise ProblemError(f"importing it raised {type(exc).__name__}: {str(exc)[:200]}") from None
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if not callable(getattr(module, name, None)):
                raise ProblemError(f"defines no {name}: a KernelBench problem has Model, get_inputs and "
                                   "get_init_inputs")
        return module

    def integer_globals(self) -> dict[str, int]:
        """Module-level integers as written, in definition order: the candidate sizes."""
        return {k: v for k, v in vars(self.module()).items()
                if isinstance(v, int) and not isinstance(v, bool) and not k.startswith("_")}

    def _build(self, sizes: Mapping[str, int], seed: int, with_inputs: bool = True) -> tuple[Any, list[Any]]:
        import torch

        module = self.module(sizes)
        with self._lock:
            torch.manual_seed(seed)
            model = module.Model(*module.get_init_inputs())
            return model, list(module.get_inputs()) if with_inputs else []

    # --- shapes ----------------------------------------------------------------------------------------
    def trace(self, sizes: Mapping[str, int]) -> ProblemTrace:
        """The kernel's arrays at these sizes, from a run on torch's meta device (no memory, no arithmetic)."""
        import torch

        self.module(sizes)  # executed outside the meta context: module-level tensors stay real
        with self._lock, torch.device("meta"):
            try:
                model, inputs = self._build(sizes, 0)
                with torch.no_grad():
                    result = model(*inputs)
            except ProblemError:
                raise
            except Exception as exc:  # the problem's own code on these sizes: any failure means "not these sizes"
                raise ProblemError(f"running the model at sizes {dict(sizes)} failed: {type(exc).__name__}: "
                                   f"{str(exc)[:200]}") from None
        names = _forward_names(model.forward, len(inputs))
        input_slots = []
        for name, value in zip(names, inputs, strict=True):
            if not isinstance(value, torch.Tensor):
                raise ProblemError(f"input {name!r} is a {type(value).__name__}, not a tensor: only tensor inputs "
                                   "become kernel arguments")
            if value.dtype != torch.float32:
                raise ProblemError(f"input {name!r} is {value.dtype}: only float32 inputs can be expressed")
            input_slots.append(TensorSlot(name, "input", tuple(value.shape), "float32"))
        taken = {s.name for s in input_slots}
        params = []
        for key, value in model.state_dict().items():
            if not value.is_floating_point():
                continue  # integer buffers (BatchNorm's num_batches_tracked) stay inside the model
            if value.dtype != torch.float32:
                raise ProblemError(f"parameter {key!r} is {value.dtype}: only float32 parameters can be expressed")
            name = _unique(c_identifier(key), taken)
            params.append(TensorSlot(name, "param", tuple(value.shape), "float32", key=key))
        if isinstance(result, tuple | list):
            raise ProblemError(f"forward returns {len(result)} values: only a single output tensor can be expressed")
        if not isinstance(result, torch.Tensor):
            raise ProblemError(f"forward returns a {type(result).__name__}, not a tensor")
        dtype = _DTYPES.get(str(result.dtype))
        if dtype is None:
            raise ProblemError(f"the output is {result.dtype}: only float32 and int64 outputs can be expressed")
        shape = tuple(result.shape) or (1,)
        return ProblemTrace(input_slots, params, TensorSlot(_unique("out", taken), "output", shape, dtype))

    # --- data ------------------------------------------------------------------------------------------
    def generate(self, rng: np.random.Generator, sizes: Mapping[str, int],
                 trace: ProblemTrace) -> dict[str, np.ndarray]:
        """Inputs from the problem's own get_inputs() and parameters from its own initialisation, seeded by rng."""
        with self._lock:
            model, inputs = self._build(sizes, int(rng.integers(0, 2**62)))
            state = model.state_dict()
            arrays = {s.name: v.detach().numpy() for s, v in zip(trace.inputs, inputs, strict=True)}
            arrays.update({s.name: state[s.key].detach().numpy() for s in trace.params})
        return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}

    def run(self, arrays: Mapping[str, np.ndarray], sizes: Mapping[str, int], trace: ProblemTrace,
            float64: bool = True) -> np.ndarray:
        """The model's output on these inputs and parameters: in float64 for checking kernels, in float32 (what
        KernelBench times) for measuring. Only the forward pass runs: the model is built once per size set and
        the arrays are handed to it without copies in float32 (torch.func.functional_call)."""
        import torch

        dtype = torch.float64 if float64 else torch.float32
        key = (tuple(sorted((k, int(v)) for k, v in sizes.items())), float64)
        with self._lock:
            model = self._models.get(key)
            if model is None:
                model = self._build(sizes, 0, with_inputs=False)[0].to(dtype)
                self._models = {**self._models, key: model} if len(self._models) < 16 else {key: model}
        state = {slot.key: torch.from_numpy(np.asarray(arrays[slot.name])).to(dtype) for slot in trace.params}
        inputs = tuple(torch.from_numpy(np.asarray(arrays[s.name])).to(dtype) for s in trace.inputs)
        with torch.no_grad():
            try:
                result = torch.func.functional_call(model, state, inputs)
            except Exception as exc:  # the problem's own forward: report it as the problem's failure
                raise ProblemError(f"the model's forward failed: {type(exc).__name__}: {str(exc)[:200]}") from None
        return result.detach().cpu().numpy().reshape(trace.output.shape)


def _forward_names(forward: Callable[..., Any], count: int) -> list[str]:
    params = [p for p in inspect.signature(forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [c_identifier(p.name) for p in params[:count]]
    if len(names) < count or len(set(names)) < count:
        names = [f"x{i}" for i in range(count)]
    return names


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    taken.add(candidate)
    return candidate


class ImportedTaskRuntime:
    """What an imported task's reference.py delegates to: maps the kernel's size arguments to the problem."""

    def __init__(self, folder: Path, problem_sizes: Sequence[str]) -> None:
        self.problem = KernelBenchProblem(folder / PROBLEM_FILE)
        self.problem_sizes = tuple(problem_sizes)  # the size arguments that are the problem's own globals
        self._traces: dict[tuple[int, ...], ProblemTrace] = {}

    def _problem_sizes(self, sizes: Mapping[str, int]) -> dict[str, int]:
        return {k: int(sizes[k]) for k in self.problem_sizes}

    def _trace(self, sizes: Mapping[str, int]) -> ProblemTrace:
        # Every other size argument is derived from the problem's own (an output extent, a weight extent).
        key = tuple(int(sizes[k]) for k in self.problem_sizes)
        if key not in self._traces:
            self._traces[key] = self.problem.trace(self._problem_sizes(sizes))
        return self._traces[key]

    def generate(self, rng: np.random.Generator, sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
        return self.problem.generate(rng, self._problem_sizes(sizes), self._trace(sizes))

    def reference(self, arrays: Mapping[str, np.ndarray], sizes: Mapping[str, int]) -> np.ndarray:
        return self.problem.run(arrays, self._problem_sizes(sizes), self._trace(sizes))

    def benchmark(self, arrays: Mapping[str, np.ndarray], sizes: Mapping[str, int]) -> np.ndarray:
        return self.problem.run(arrays, self._problem_sizes(sizes), self._trace(sizes), float64=False)
