"""The child side of compile_kernel for the ``triton`` target: compile ahead of time for a named GPU, no GPU needed.

Runs in the sandbox. Imports the user's module (a syntax or import error is a compile error at its line), then
calls its launcher ``kernel(...)`` on empty CPU tensors of the profiling size with a driver that only knows the
target GPU: every ``kernel_fn[grid](...)`` launch is compiled (warm-up) instead of run, with the same
specialisation a real launch of those arguments would get. Triton's frontend errors are mapped to the user's
lines; the resource use of each compiled kernel comes from the bundled ``cuobjdump``.

Two processes: this driver never imports the user's module. It forks a child (confined to itself by the worker's
system-call filter; the driver is non-dumpable) that closes the result descriptor, imports the module, compiles
and hands back the compiled binaries and its diagnostics through a pipe. The driver alone writes the result: a
compile is ok only when the child ended normally and handed over at least one cubin, and every resource figure
is read by the driver's own ``cuobjdump`` from those binaries. The module cannot reach the result descriptor, so
it cannot write ``ok: true`` or invent register counts; the server still parses the result as untrusted input.
"""

from __future__ import annotations

import base64
import ctypes
import importlib.util
import json
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

from kope_mcp.runtime import sandbox_seccomp

_PR_SET_DUMPABLE = 4
_REPORT_CAP = 64 * 1024**2
_RESOURCE = re.compile(r"Function (?P<name>\S+):\s*\n\s*REG:(?P<reg>\d+) STACK:(?P<stack>\d+) SHARED:(?P<shared>\d+) "
                       r"LOCAL:(?P<local>\d+)")


class _AotDriver:
    """Just enough of a Triton driver for ``JITFunction.run(warmup=True)``: the target, device 0, stream 0."""

    def __init__(self, target: Any, torch: Any) -> None:
        self.target, self.torch = target, torch

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def get_active_torch_device(self) -> Any:
        return self.torch.device("cpu")


def _diagnostic(line: int, column: int, message: str, severity: str = "error") -> dict[str, Any]:
    return {"line": line, "column": column, "severity": severity, "message": message}


def _frontend_error(exc: Any, user_file: str) -> dict[str, Any]:
    """A triton CompilationError: its node's line is relative to the @triton.jit function's `def` line."""
    node = getattr(exc, "node", None)
    src = getattr(exc, "src", None)
    base = _def_line(user_file, src if isinstance(src, str) else getattr(src, "src", "") or "")
    line = (base + node.lineno - 1) if node is not None and base else 0
    column = getattr(node, "col_offset", -1) + 1 if node is not None else 0
    message = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    return _diagnostic(line, column, f"triton: {message}")


def _def_line(user_file: str, src: str) -> int:
    first = next((ln for ln in src.splitlines() if ln.lstrip().startswith("def ")), "")
    for number, text in enumerate(Path(user_file).read_text().splitlines(), 1):
        if first and text.strip() == first.strip():
            return number
    return 0


def _python_error(exc: BaseException, user_file: str) -> dict[str, Any]:
    if isinstance(exc, SyntaxError) and exc.filename == user_file:
        return _diagnostic(exc.lineno or 0, exc.offset or 0, f"{type(exc).__name__}: {exc.msg}")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == user_file]
    line = frames[-1].lineno if frames else 0
    return _diagnostic(line or 0, 0, f"{type(exc).__name__}: {str(exc)[:500]}")


def _resources(cubin: bytes, work: Path, cuobjdump: Path) -> dict[str, int]:
    path = work / "k.cubin"
    path.write_bytes(cubin)
    try:
        out = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(path)], capture_output=True, text=True,
                             timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    finally:
        path.unlink(missing_ok=True)
    match = _RESOURCE.search(out)
    if match is None:
        return {}
    return {"registers": int(match["reg"]), "shared_bytes": int(match["shared"]),
            "local_bytes": int(match["local"]) + int(match["stack"])}


def compile_module(job: dict[str, Any]) -> dict[str, Any]:
    user_file = job["source"]
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    arch = int(job["arch"])
    driver.set_active(_AotDriver(GPUTarget("cuda", arch, 32), torch))  # type: ignore[arg-type]
    compiled: list[tuple[str, Any]] = []
    original = JITFunction.run

    def compile_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    JITFunction.run = compile_only  # type: ignore[method-assign]
    spec = importlib.util.spec_from_file_location("kope_kernel", user_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kope_kernel"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's module may raise anything at import: a compile error at its line
        return {"ok": False, "diagnostics": [_python_error(exc, user_file)]}
    if not callable(getattr(module, "kernel", None)):
        return {"ok": False, "diagnostics": [_diagnostic(0, 0, "kernel.py defines no function `kernel(...)` "
                                                         f"(expected: {job['signature']})")]}
    kwargs: dict[str, Any] = {}
    for a in job["args"]:
        if a["kind"] in ("in", "out"):
            kwargs[a["name"]] = torch.empty(a["shape"], dtype=getattr(torch, a["dtype"]))
        elif a["kind"] == "size":
            kwargs[a["name"]] = int(job["sizes"][a["name"]])
        else:
            kwargs[a["name"]] = float(a["value"])
    try:
        module.kernel(**kwargs)
    except triton.CompilationError as exc:
        return {"ok": False, "diagnostics": [_frontend_error(exc, user_file)]}
    except Exception as exc:  # the launcher's own bug, or a backend failure (ptxas): a compile error
        return {"ok": False, "diagnostics": [_python_error(exc, user_file)]}
    if not compiled:
        return {"ok": False, "diagnostics": [_diagnostic(0, 0, "kernel(...) launched no @triton.jit kernel on the "
                                                         "profiling-size arguments")]}
    kernels = []
    for name, kernel in {n: k for n, k in compiled}.items():
        cubin = kernel.asm.get("cubin")
        kernels.append({"name": name, "num_warps": kernel.metadata.num_warps,
                        "cubin": base64.b64encode(cubin).decode() if isinstance(cubin, bytes) else None})
    return {"ok": True, "diagnostics": [], "kernels": kernels, "triton": triton.__version__}


def _child(job: dict[str, Any], channel: int) -> None:
    """The untrusted side: import and compile the module, report through ``channel``. Never returns."""
    code = 1
    try:
        os.close(int(job["result_fd"]))
        filter_hex = job.get("worker_filter")
        sandbox_seccomp.confine_to_self(bytes.fromhex(filter_hex) if filter_hex else None)
        report = compile_module(job)
        with os.fdopen(channel, "wb") as out:
            out.write(json.dumps(report).encode())
        code = 0
    finally:
        os._exit(code)


def _judge(raw: bytes, status: int, work: Path) -> dict[str, Any]:
    """The driver's result from what the child handed over: figures only from binaries cuobjdump reads."""
    try:
        report = json.loads(raw) if raw else None
    except ValueError:
        report = None
    if not isinstance(report, dict) or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        how = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else
               f"exited with code {os.WEXITSTATUS(status)}" if os.WIFEXITED(status) else "ended")
        return {"ok": False, "diagnostics": [_diagnostic(0, 0, f"the module's compile step {how} without a "
                                                         "readable report (did kernel.py exit, fork or write to "
                                                         "descriptors it does not own?)")]}
    diagnostics = report.get("diagnostics") if isinstance(report.get("diagnostics"), list) else []
    if report.get("ok") is not True:
        return {"ok": False, "diagnostics": diagnostics or [_diagnostic(0, 0, "the Triton compile failed")]}
    cuobjdump = _cuobjdump()
    kernels = []
    listed = report.get("kernels")
    for item in listed if isinstance(listed, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("cubin"), str):
            continue
        try:
            cubin = base64.b64decode(item["cubin"], validate=True)
        except ValueError:
            continue
        figures = _resources(cubin, work, cuobjdump) if cuobjdump is not None else {}
        if cuobjdump is not None and not figures:
            continue  # not a binary cuobjdump can read: nothing compiled here
        warps = item.get("num_warps")
        kernels.append({"name": str(item.get("name", ""))[:200],
                        "num_warps": warps if isinstance(warps, int) and 1 <= warps <= 64 else None, **figures})
    if not kernels:
        return {"ok": False, "diagnostics": [_diagnostic(0, 0, "kernel(...) produced no compiled @triton.jit "
                                                         "kernel on the profiling-size arguments")]}
    return {"ok": True, "diagnostics": diagnostics, "kernels": kernels}


def _cuobjdump() -> Path | None:
    # Found without importing triton: the driver imports nothing the module could have touched.
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return path if path.is_file() else None


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[1]).read_text())
    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # the child cannot open this process's descriptors
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _child(job, write_end)
    os.close(write_end)
    chunks, size = [], 0
    with os.fdopen(read_end, "rb") as source:
        while size <= _REPORT_CAP and (chunk := source.read(1 << 20)):
            chunks.append(chunk)
            size += len(chunk)
    _, status = os.waitpid(pid, 0)
    result = _judge(b"".join(chunks) if size <= _REPORT_CAP else b"", status, Path(os.getcwd()))
    os.write(int(job["result_fd"]), json.dumps(result).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
