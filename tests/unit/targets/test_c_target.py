from pathlib import Path

import pytest

from kope_mcp.runtime.sandbox import capabilities
from kope_mcp.settings import KopeSettings
from kope_mcp.targets.builds import TamperedBuildError
from kope_mcp.targets.c import CpuCTarget
from tests.conftest import VECTOR_ADD_OK


@pytest.fixture
def backend(tmp_path: Path) -> CpuCTarget:
    settings = KopeSettings(home=tmp_path / "home")
    settings.ensure_home()
    return CpuCTarget(settings)


def test_same_source_and_flags_is_a_cache_hit_and_other_flags_are_not(backend, registry):
    task = registry.get("vector_add")
    first = backend.compile(task, VECTOR_ADD_OK, ["-O3"])
    again = backend.compile(task, VECTOR_ADD_OK, ["-O3"])
    other = backend.compile(task, VECTOR_ADD_OK, ["-O1"])
    assert first.ok and not first.cached
    assert again.cached and again.build_hash == first.build_hash and again.artifact == first.artifact
    assert not other.cached and other.build_hash != first.build_hash


def test_errors_point_at_lines_of_the_submitted_source(backend, registry):
    source = VECTOR_ADD_OK.replace("a[i] + b[i]", "a[i] + b[j]")
    result = backend.compile(registry.get("vector_add"), source)
    assert not result.ok and result.artifact is None
    error = next(d for d in result.diagnostics if d.severity == "error")
    assert error.line == 4 and "j" in error.message
    assert str(backend.builds_dir) not in result.log


def test_a_definition_that_does_not_match_the_prototype_is_an_error(backend, registry):
    result = backend.compile(registry.get("vector_add"), "#include <stdint.h>\nvoid kernel(float *a, int n) {}\n")
    assert not result.ok
    assert any("conflicting types" in d.message and d.line == 2 for d in result.diagnostics)


def test_a_source_without_kernel_is_an_error(backend, registry):
    result = backend.compile(registry.get("vector_add"), "int helper(void) { return 1; }\n")
    assert not result.ok
    assert any("does not define a function named `kernel`" in d.message for d in result.diagnostics)


@pytest.mark.skipif(not capabilities().isolated, reason="needs the sandbox")
def test_the_compiler_cannot_see_the_servers_files(backend, registry, tmp_path):
    secret = tmp_path / "secret.h"
    secret.write_text("#define SECRET 42\n")
    result = backend.compile(registry.get("vector_add"), f'#include "{secret}"\n' + VECTOR_ADD_OK)
    assert not result.ok
    assert any("No such file" in d.message for d in result.diagnostics)


def test_a_call_to_an_undeclared_function_is_a_compile_error_at_its_line(backend, registry):
    source = VECTOR_ADD_OK.replace("out[i] = a[i] + b[i];", "out[i] = a[i] + b[i];\n    helper_nobody_defines(out);")
    result = backend.compile(registry.get("vector_add"), source)
    assert not result.ok
    assert any(d.severity == "error" and d.line == 5 and "helper_nobody_defines" in d.message
               for d in result.diagnostics)


def test_a_cached_library_that_changed_is_rebuilt_not_loaded(backend, registry):
    task = registry.get("vector_add")
    first = backend.compile(task, VECTOR_ADD_OK)
    assert first.ok and first.artifact is not None and first.sha256
    first.artifact.write_bytes(b"\x7fELF forged")
    with pytest.raises(TamperedBuildError):
        backend.artifact(first.build_hash)
    again = backend.compile(task, VECTOR_ADD_OK)
    assert again.ok and not again.cached and again.sha256 == first.sha256
    assert backend.artifact(again.build_hash).read_bytes() != b"\x7fELF forged"
