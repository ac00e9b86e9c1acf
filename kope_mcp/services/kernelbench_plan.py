"""How a KernelBench problem becomes a task folder: the scale, the cases, the tolerance, task.toml and reference.py.

Runs in the sandbox (:mod:`kope_mcp.app.kernelbench_worker`): deciding all of it executes the problem file (a PyTorch
module from the internet) many times. The rules are in kernelbench_import.py's docstring and docs/tasks.md.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kope_mcp.tasks.kernelbench import KernelBenchProblem, ProblemError, ProblemTrace

SCALABLE_MIN = 16
ELEMENT_BUDGET = 1 << 24
# Under a second, as asked, with headroom: a first naive C kernel is often 10-50x slower than PyTorch's BLAS.
REFERENCE_BUDGET_S = 0.1
KERNELBENCH_TOLERANCE = 1e-4
CASE_COUNT = 8
_PRIMES = (3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
_FAMILY_WORDS: tuple[tuple[str, str, int], ...] = (
    # (word in the file name, family, default level); first match wins
    ("attention", "attention", 4), ("conv", "convolution", 3), ("matmul", "matmul", 3), ("gemm", "matmul", 3),
    ("matrix", "matmul", 3), ("linear", "matmul", 3), ("pool", "pooling", 2), ("softmax", "normalization", 2),
    ("norm", "normalization", 2), ("loss", "loss", 2), ("entropy", "loss", 2), ("cumsum", "scan", 2),
    ("cumprod", "scan", 2), ("scan", "scan", 2), ("argmax", "reduction", 2), ("argmin", "reduction", 2),
    ("sum", "reduction", 2), ("mean", "reduction", 2), ("max", "reduction", 2), ("min", "reduction", 2),
    ("prod", "reduction", 2), ("reduction", "reduction", 2), ("relu", "activation", 1), ("gelu", "activation", 1),
    ("sigmoid", "activation", 1), ("tanh", "activation", 1), ("swish", "activation", 1), ("elu", "activation", 1),
    ("softplus", "activation", 1), ("softsign", "activation", 1), ("hardtanh", "activation", 1),
    ("transpose", "data-movement", 2), ("concat", "data-movement", 2), ("gather", "data-movement", 2),
)



class _Plan:
    """Everything decided about one problem before anything is written."""

    def __init__(self, problem: KernelBenchProblem, path: Path) -> None:
        self.problem, self.path = problem, path
        self.ints = problem.integer_globals()
        self.scalable = [g for g, v in self.ints.items() if v >= SCALABLE_MIN]
        self.shift, self.base, self.base_trace = self._choose_scale()
        self.cases = self._cases()

    def _at(self, shift: int) -> dict[str, int]:
        return {**self.ints, **{g: max(1, self.ints[g] >> shift) for g in self.scalable}}

    def _choose_scale(self) -> tuple[int, dict[str, int], ProblemTrace]:
        reason = ""
        for shift in range(0, 40):
            sizes = self._at(shift)
            if shift and sizes == self._at(shift - 1):
                break  # every size is already 1: scaling cannot help any more
            try:
                trace = self.problem.trace(sizes)
            except ProblemError:
                if shift == 0:
                    raise
                break  # too small for the model (a kernel larger than its input): stop here
            if trace.elements() > ELEMENT_BUDGET:
                reason = f"{trace.elements()} elements at 1/{2**shift}"
                continue
            arrays = self.problem.generate(np.random.default_rng(0), sizes, trace)
            elapsed = self._time_reference(arrays, sizes, trace)
            if elapsed <= REFERENCE_BUDGET_S:
                return shift, sizes, trace
            reason = f"the reference takes {elapsed:.2f} s at 1/{2**shift}"
        raise ProblemError(f"no scale of its sizes {self.scalable or '(none)'} fits: {reason or 'cannot scale'}")

    def _time_reference(self, arrays: dict[str, np.ndarray], sizes: dict[str, int], trace: ProblemTrace) -> float:
        best = math.inf
        for _ in range(2):  # the first call also pays one-off costs (building the model, thread pools)
            start = time.perf_counter()
            self.problem.run(arrays, sizes, trace)
            best = min(best, time.perf_counter() - start)
            if best <= REFERENCE_BUDGET_S:
                break
        return best

    def _candidates(self) -> Iterator[tuple[str, dict[str, int]]]:
        b = {g: self.base[g] for g in self.scalable}
        names = list(b)

        def each(f: Callable[[int, int], int]) -> dict[str, int]:
            # f(index of the size, its profiling value); never above the profiling value, never below 1
            return {g: max(1, min(b[g], f(i, b[g]))) for i, g in enumerate(names)}

        yield "half", each(lambda i, v: v // 2)
        yield "quarter_odd", each(lambda i, v: (v // 4) | 1)
        yield "eighth_plus_prime", each(lambda i, v: v // 8 + _PRIMES[i % len(_PRIMES)])
        yield "small_primes", each(lambda i, v: _PRIMES[i % len(_PRIMES)])
        yield "ones", each(lambda i, v: 1)
        yield "sixteenth_minus_one", each(lambda i, v: v // 16 - 1)
        yield "first_large_rest_small", each(lambda i, v: (v // 2) | 1 if i == 0 else 3)
        yield "last_large_rest_small", each(lambda i, v: (v // 2) | 1 if i == len(names) - 1 else 3)
        yield "three_quarters_odd", each(lambda i, v: (v * 3 // 4) | 1)
        yield "third_plus_two", each(lambda i, v: v // 3 + 2)
        yield "sixteenth", each(lambda i, v: v // 16)
        yield "thirty_second_plus_one", each(lambda i, v: v // 32 + 1)

    def _cases(self) -> list[tuple[str, dict[str, int], ProblemTrace]]:
        found: list[tuple[str, dict[str, int], ProblemTrace]] = []
        seen: set[tuple[int, ...]] = set()
        for name, changed in self._candidates():
            sizes = {**self.base, **changed}
            key = tuple(sizes[g] for g in self.scalable)
            if key in seen:
                continue
            try:
                trace = self.problem.trace(sizes)
            except ProblemError:
                continue  # not every derivative is valid for every model (a conv needs room for its kernel)
            seen.add(key)
            found.append((name, sizes, trace))
            if len(found) == CASE_COUNT:
                break
        if not found:
            found.append(("profile_size", self.base, self.base_trace))
        # Too few distinct valid sizes: repeat them with other seeds (a case's name decides its seed).
        distinct = list(found)
        while len(found) < CASE_COUNT:
            name, sizes, trace = distinct[len(found) % len(distinct)]
            found.append((f"{name}_seed{len(found) // len(distinct) + 1}", sizes, trace))
        return found


def _tolerance(plan: _Plan) -> float:
    """KernelBench's 1e-4 (abs and rel), loosened to the next power of ten when PyTorch's own float32 result
    misses the float64 reference by more than that on these cases: a kernel as accurate as PyTorch passes."""
    if plan.base_trace.output.dtype != "float32":
        return 0.0
    need = 0.0
    for _, sizes, trace in plan.cases[:3]:
        arrays = plan.problem.generate(np.random.default_rng(1), sizes, trace)
        exact = plan.problem.run(arrays, sizes, trace)
        single = plan.problem.run(arrays, sizes, trace, float64=False).astype(np.float64)
        finite = np.isfinite(exact) & np.isfinite(single)
        if finite.any():
            err = np.abs(single[finite] - exact[finite])
            need = max(need, float((err / (KERNELBENCH_TOLERANCE * (1 + np.abs(exact[finite])))).max()))
    if need <= 1.0:
        return KERNELBENCH_TOLERANCE
    return KERNELBENCH_TOLERANCE * 10 ** math.ceil(math.log10(2 * need))


def _name_sizes(plan: _Plan) -> tuple[dict[tuple[int, int], str | int], list[str]]:
    """A name (or a constant) for every extent of every array, and the size arguments in prototype order.

    An extent that is the same in every case is a literal. One that varies is named after the problem variable
    it always equals, else ``<array>_dim<axis>`` (an output extent computed from the others).
    """
    configs = [sizes for _, sizes, _ in plan.cases] + [plan.base]
    traces = [trace for _, _, trace in plan.cases] + [plan.base_trace]
    variable_globals = {g: tuple(c[g] for c in configs) for g in plan.scalable}
    taken = {s.name for s in plan.base_trace.slots}
    clash = sorted(taken & set(variable_globals))
    if clash:
        raise ProblemError(f"the size variable(s) {clash} have the names of kernel arrays; rename them in the file")
    taken |= set(variable_globals)
    named: dict[tuple[int, ...], str] = {}
    result: dict[tuple[int, int], str | int] = {}
    for si, slot in enumerate(plan.base_trace.slots):
        for axis in range(len(slot.shape)):
            vector = tuple(t.slots[si].shape[axis] for t in traces)
            if len(set(vector)) == 1:
                result[(si, axis)] = vector[0]
                continue
            if vector not in named:
                match = [g for g, v in variable_globals.items() if v == vector]
                name = match[0] if match else f"{slot.name}_dim{axis}"
                while name in taken and not match:
                    name += "_"
                taken.add(name)
                named[vector] = name
            result[(si, axis)] = named[vector]
    # Problem variables that scale but are no array's extent still travel as arguments: the model uses them.
    size_args = list(named.values())
    size_args += [g for g in variable_globals if g not in size_args]
    return result, size_args


def _size_values(plan: _Plan, trace: ProblemTrace, sizes: dict[str, int],
                 sizes_of_slot: dict[tuple[int, int], str | int]) -> dict[str, int]:
    values = {g: sizes[g] for g in plan.scalable}
    for (si, axis), name in sizes_of_slot.items():
        if isinstance(name, str):
            values[name] = trace.slots[si].shape[axis]
    return values


def _toml_string(text: str) -> str:
    if "'''" not in text and all(ch in "\n\t" or ord(ch) >= 32 for ch in text):
        return "'''\n" + text + "'''"
    return json.dumps(text, ensure_ascii=False)


def _family_and_level(path: Path) -> tuple[str, int]:
    stem = path.stem.lower()
    family, level = next(((f, lv) for word, f, lv in _FAMILY_WORDS if word in stem), ("elementwise", 1))
    kb_level = re.search(r"level[_\-]?([1-4])", str(path).lower())
    return family, max(level, int(kb_level.group(1)) if kb_level else 1)


def _write_task(folder: Path, task_id: str, plan: _Plan, sizes_of_slot: dict[tuple[int, int], str | int],
                size_args: list[str], tolerance: float) -> None:
    trace = plan.base_trace
    family, level = _family_and_level(plan.path)
    global_sizes = list(plan.scalable)
    shapes = {slot.name: [sizes_of_slot[(si, a)] for a in range(len(slot.shape))]
              for si, slot in enumerate(trace.slots)}
    doc = (plan.problem.module().Model.__doc__ or "").strip().splitlines()
    summary = f"KernelBench {plan.path.stem}" + (f": {doc[0].strip()}" if doc else "")
    if len(summary) > 100:
        summary = summary[:97] + "..."
    params = ", ".join(f"{s.name} (= model {s.key})" for s in trace.params) or "none"
    scaled = ", ".join(f"{g}={plan.ints[g]}->{plan.base[g]}" for g in plan.scalable) or "none"
    description = (
        f"Imported from the KernelBench problem {plan.path.name} (verbatim in problem.py, below). The reference "
        "runs its PyTorch Model on the CPU in float64. There is no C baseline: speedups are measured against "
        "that PyTorch reference, as KernelBench does.\n"
        f"Kernel arguments: the forward inputs ({', '.join(s.name for s in trace.inputs) or 'none'}), then the "
        f"model's parameters ({params}), then the output {trace.output.name}, then the sizes. Inputs come from "
        "the problem's get_inputs() and parameters from the model's own initialisation, seeded per case.\n"
        f"Sizes scaled by 1/{2 ** plan.shift} from the problem's (so the reference runs in under 0.1 s here): "
        f"{scaled}. Size arguments that are not problem variables are extents of the arrays they name.\n\n"
        "```python\n" + plan.problem.source.rstrip() + "\n```\n"
    )

    def arg_line(name: str, kind: str, shape: list[str | int] | None = None, dtype: str = "float32") -> str:
        parts = [f'name = "{name}"', f'kind = "{kind}"', f'dtype = "{"int64" if kind == "size" else dtype}"']
        if shape is not None:
            parts.append("shape = [" + ", ".join(json.dumps(e) for e in shape) + "]")
        return "  { " + ", ".join(parts) + " },"

    def nbytes(slot_shape: list[str | int], itemsize: int) -> str:
        return f"{itemsize}*" + "*".join(str(e) for e in slot_shape) if slot_shape else str(itemsize)

    out = trace.output
    lines = [
        f'id = "{task_id}"', f'family = "{family}"', f"level = {level}", f"summary = {json.dumps(summary)}",
        f"description = {_toml_string(description)}", "flops = 0",
        "bytes = " + json.dumps(" + ".join(nbytes(shapes[s.name], 8 if s.dtype == "int64" else 4)
                                           for s in trace.slots)),
        "args = [",
        *[arg_line(s.name, "in", shapes[s.name]) for s in [*trace.inputs, *trace.params]],
        arg_line(out.name, "out", shapes[out.name], out.dtype),
        *[arg_line(name, "size") for name in size_args],
        "]", "cases = [",
    ]
    for name, sizes, case_trace in plan.cases:
        values = _size_values(plan, case_trace, sizes, sizes_of_slot)
        lines.append(f'  {{ name = "{name}", sizes = {_inline(values, size_args)} }},')
    lines.append("]")
    profile = _size_values(plan, trace, plan.base, sizes_of_slot)
    lines.append(f'profile = {{ name = "profile_scaled_1_{2 ** plan.shift}", sizes = {_inline(profile, size_args)} }}')
    lines.append(f"tolerance = {{ {out.dtype} = {{ atol = {tolerance}, rtol = {tolerance} }} }}")
    # Sizes of a KernelBench problem depend on each other (an output extent is length - kernel_size + 1):
    # run_tests cannot draw them independently; profile_kernel still checks the profiling size.
    lines.append("drawn_cases = false")
    (folder / "task.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")

    non_outputs = [s.name for s in [*trace.inputs, *trace.params]] + size_args
    size_dict = "{" + ", ".join(f'"{g}": {g}' for g in global_sizes) + "}"
    array_dict = "{" + ", ".join(f'"{s.name}": {s.name}' for s in [*trace.inputs, *trace.params]) + "}"
    (folder / "reference.py").write_text(
        f'"""Reference of a task imported from the KernelBench problem {plan.path.name} (verbatim in problem.py):\n'
        'its PyTorch Model on the CPU in float64. Written by `kope tasks import-kernelbench`."""\n\n'
        "from pathlib import Path\n\nfrom kope_mcp.tasks.kernelbench import ImportedTaskRuntime\n\n"
        f"_RUNTIME = ImportedTaskRuntime(Path(__file__).parent, problem_sizes={tuple(global_sizes)!r})\n\n\n"
        f"def generate({', '.join(['rng', *size_args])}):\n"
        f"    return _RUNTIME.generate(rng, {size_dict})\n\n\n"
        f"def reference({', '.join(non_outputs)}):\n"
        f"    return _RUNTIME.reference({array_dict}, {size_dict})\n\n\n"
        "# What profile_kernel times as the reference (and, with no C baseline, as the baseline): the float32\n"
        "# forward pass alone, as KernelBench times PyTorch.\n"
        f"def benchmark({', '.join(non_outputs)}):\n"
        f"    return _RUNTIME.benchmark({array_dict}, {size_dict})\n",
        encoding="utf-8",
    )


def _inline(values: dict[str, int], order: list[str]) -> str:
    return "{ " + ", ".join(f"{k} = {values[k]}" for k in order) + " }"


def plan_problem(path: Path, task_id: str) -> dict[str, Any]:
    """The task folder's generated files for one problem file, and what was decided (never writes outside)."""
    plan = _Plan(KernelBenchProblem(path), path)
    tolerance = _tolerance(plan)
    with tempfile.TemporaryDirectory(prefix="kope-kb-plan-") as scratch:
        folder = Path(scratch)
        sizes_of_slot, size_args = _name_sizes(plan)
        _write_task(folder, task_id, plan, sizes_of_slot, size_args, tolerance)
        files = {name: (folder / name).read_text(encoding="utf-8") for name in ("task.toml", "reference.py")}
    return {"files": files, "scale": f"1/{2 ** plan.shift}", "tolerance": tolerance}
