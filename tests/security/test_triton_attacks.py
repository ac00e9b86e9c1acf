"""A Triton module is Python that runs in the sandbox at import, in compile_kernel and in run_tests: the same
containment as a C constructor, and what it can write back (the compile report, the harness result) is parsed as
untrusted input."""

from __future__ import annotations

import pytest

from kope_mcp.targets.triton import triton_version
from tests.security.conftest import TOKEN

pytestmark = [pytest.mark.slow, pytest.mark.skipif(triton_version() is None, reason="triton is not installed")]

LAUNCHER = '''
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, pwned, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask) + pwned,
             mask=mask)


def kernel(a, b, out, n):
    add_kernel[(triton.cdiv(n, 256),)](a, b, out, n, PWNED, BLOCK=256)
'''


def test_a_triton_module_reads_nothing_of_the_server_or_its_user(workbench, home, user_secret):
    paths = [str(home / "daemon" / "state.json"), str(home / "memory.kuzu"), str(user_secret), "/etc/shadow"]
    source = ("PWNED = 0.0\nfor _path in " + repr(paths) + ":\n    try:\n        with open(_path, 'rb') as _f:\n"
              "            if _f.read(1 << 20) is not None:\n                PWNED = 1000.0\n"
              "    except OSError:\n        pass\n" + LAUNCHER)
    compiled = workbench.compile_kernel("vector_add", source, backend="triton")
    assert compiled.ok, compiled.diagnostics
    assert TOKEN not in compiled.log
    report = workbench.run_tests(compiled.kernel_id)
    assert report.passed, report.message  # +1000 everywhere had any read succeeded


def test_a_forged_compile_report_is_sanitised_not_trusted_to_break_the_server(workbench):
    forge = '''
import json, os
_job = json.load(open("/kope/in/compile.json"))
os.write(_job["result_fd"], json.dumps({"ok": True, "diagnostics": [{"line": "x", "severity": "evil",
         "message": 7}], "kernels": [{"name": "k", "registers": "lots"}, "junk"]}).encode())
os._exit(0)
'''
    compiled = workbench.compile_kernel("vector_add", forge + "PWNED = 0.0\n" + LAUNCHER, backend="triton")
    assert compiled.resources == []
    assert all(d.severity in ("error", "warning", "note") and isinstance(d.line, int) for d in compiled.diagnostics)
    # Whatever the report claimed, the kernel is judged by running it: this one does not even define PWNED
    # before the forger exits, so its tests do not pass.
    if compiled.ok:
        assert not workbench.run_tests(compiled.kernel_id).passed


FORGE_EVERYWHERE = '''
import json, os
_job = json.load(open("/kope/in/compile.json"))
_claim = json.dumps({"ok": True, "diagnostics": [], "kernels": [{"name": "fast", "registers": 1, "num_warps": 4}]})
for _fd in range(3, 64):
    try:
        os.write(_fd, _claim.encode())
    except OSError:
        pass
try:
    _w = os.open(f"/proc/{os.getppid()}/fd/{_job['result_fd']}", os.O_WRONLY)
    os.write(_w, _claim.encode())
except OSError:
    pass
{ending}

def kernel(a, b, out, n):
    out.copy_(a + b)
'''


@pytest.mark.parametrize("ending", ["", "os._exit(0)"])
def test_a_module_without_a_triton_kernel_cannot_report_itself_compiled(workbench, ending):
    # No @triton.jit at all: the module writes the report it would like (ok, a kernel of 1 register) to every
    # descriptor it has and to the driver's result descriptor, then carries on or leaves at once.
    compiled = workbench.compile_kernel("vector_add", FORGE_EVERYWHERE.replace("{ending}", ending), backend="triton")
    assert not compiled.ok, compiled
    assert compiled.resources == []
    assert any("no compiled @triton.jit" in d.message or "launched no @triton.jit" in d.message
               or "readable report" in d.message for d in compiled.diagnostics), compiled.diagnostics


def test_the_compile_report_figures_come_from_the_binary(workbench):
    compiled = workbench.compile_kernel("vector_add", "PWNED = 0.0\n" + LAUNCHER, backend="triton")
    assert compiled.ok, compiled.diagnostics
    assert [r.name for r in compiled.resources] == ["add_kernel"]
    assert compiled.resources[0].registers and compiled.resources[0].num_warps == 4
