import pytest

from kope_mcp.errors import RefusedFlagError
from kope_mcp.targets.flags import validate_flags


@pytest.mark.parametrize("flag", [
    "-O3", "-Ofast", "-Os", "-march=native", "-mtune=znver4", "-mavx2", "-mfma", "-mno-avx512f",
    "-mprefer-vector-width=512", "-funroll-loops", "-fno-math-errno", "-ffast-math", "-fopenmp", "-fopenmp-simd",
    "-fvect-cost-model=unlimited", "-DBLOCK=64", "-DUSE_AVX", "-std=c11", "-Wextra", "-g", "-Iinclude",
])
def test_codegen_flags_are_allowed(flag):
    assert validate_flags([flag]) == [flag]


@pytest.mark.parametrize("flag,why", [
    ("-o", "outputs"),
    ("-o/tmp/x", "outputs"),
    ("@/etc/passwd", "response files"),
    ("-B/tmp", "arbitrary files"),
    ("-specs=/tmp/evil", "arbitrary files"),
    ("-fplugin=/tmp/evil.so", "plugins"),
    ("-fdump-tree-all", "writes files"),
    ("-fprofile-generate", "writes files"),
    ("-I/etc", "inside the build directory"),
    ("-I../..", "inside the build directory"),
    ("-Wl,-rpath,/tmp", "linker"),
    ("-include/etc/shadow", "arbitrary files"),
    ("-lcrypto", "libm"),
    ("/etc/passwd", "extra input files"),
    ("-O3 -fplugin=x", "without spaces"),
    ("-fsomething-new", "code-generation"),
    ("-O3\n", "without spaces"),
])
def test_dangerous_flags_are_refused_with_the_reason_and_the_allow_list(flag, why):
    with pytest.raises(RefusedFlagError) as info:
        validate_flags(["-O2", flag])
    message = str(info.value)
    assert message.startswith("refused_flag:")
    assert why in message
    assert "Allowed:" in message and "-march=" in message
