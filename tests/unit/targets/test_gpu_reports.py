"""Parsing what the GPU toolchains print: nvcc's diagnostics, ptxas's resource report, architecture names."""

from __future__ import annotations

import pytest

from kope_mcp.diagnostics import parse_diagnostics
from kope_mcp.targets.cuda import demangle, parse_resources, validate_cuda_flags
from kope_mcp.targets.gpu import gpu_hardware, parse_arch

PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z12matmul_tiledPKfS0_Pflll' for 'sm_90'
ptxas info    : Function properties for _Z12matmul_tiledPKfS0_Pflll
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function '_Z3addPKfS0_Pfl' for 'sm_90'
ptxas info    : Function properties for _Z3addPKfS0_Pfl
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 384 bytes cmem[0]
"""


def test_ptxas_verbose_output_becomes_one_resource_line_per_kernel():
    assert parse_resources(PTXAS) == [
        {"name": "matmul_tiled", "registers": 40, "shared_bytes": 8192, "local_bytes": 16, "spill_stores": 8,
         "spill_loads": 4},
        {"name": "add", "registers": 12, "shared_bytes": 0, "local_bytes": 0, "spill_stores": 0, "spill_loads": 0},
    ]
    assert demangle("not_mangled") == "not_mangled"


def test_nvcc_diagnostics_point_at_the_users_lines_and_other_files_at_line_0():
    log = ('kernel.cu(5): error: identifier "j" is undefined\n'
           'kernel.cu(9): warning #177-D: variable "x" was declared but never referenced\n'
           'kope_prototype.cuh(3): error: declaration is incompatible with "void kernel(float *)"\n')
    found = parse_diagnostics(log, "kernel.cu")
    assert [(d.line, d.severity) for d in found] == [(5, "error"), (9, "warning"), (0, "error")]
    assert found[0].message == 'identifier "j" is undefined'


@pytest.mark.parametrize("text, arch", [("sm_90", 90), ("90", 90), ("sm_90a", 90), ("SM_80", 80)])
def test_architecture_names_are_accepted_in_the_usual_spellings(text, arch):
    assert parse_arch(text) == arch


@pytest.mark.parametrize("text", ["sm_9", "gfx90a", "sm_90; rm -rf /", ""])
def test_anything_else_is_not_an_architecture(text):
    with pytest.raises(ValueError):
        parse_arch(text)


def test_only_allow_listed_nvcc_flags_pass():
    from kope_mcp.errors import RefusedFlagError

    assert validate_cuda_flags(["-O2", "--use_fast_math", "--maxrregcount=64", "-DTILE=32"]) == [
        "-O2", "--use_fast_math", "--maxrregcount=64", "-DTILE=32"]
    # A flag that ends in a newline passed a `$`-anchored pattern: every allow-list matches whole flags.
    for flag in ("-Xcompiler", "-o", "--compiler-bindir=/tmp", "-ccbin", "--keep", "-I/etc", "@opts", "-O3\n",
                 "-DTILE=32\n"):
        with pytest.raises(RefusedFlagError):
            validate_cuda_flags([flag])


def test_work_without_a_gpu_has_its_own_hardware_key():
    assert gpu_hardware(None, "sm_90").key == "cuda/no-gpu/sm_90"
