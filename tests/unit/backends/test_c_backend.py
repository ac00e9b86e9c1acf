from pathlib import Path

import pytest

from kope_mcp.backends.c import CpuCBackend
from kope_mcp.sandbox import capabilities
from tests.conftest import VECTOR_ADD_OK


@pytest.fixture
def backend(tmp_path: Path) -> CpuCBackend:
    return CpuCBackend(tmp_path / "builds")


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


@pytest.mark.skipif(not capabilities().privilege_drop, reason="needs root to compile as 'nobody'")
def test_the_compiler_cannot_read_private_files(backend, registry, tmp_path):
    secret = tmp_path / "secret.h"
    secret.write_text("#define SECRET 42\n")
    secret.chmod(0o600)
    result = backend.compile(registry.get("vector_add"), f'#include "{secret}"\n' + VECTOR_ADD_OK)
    assert not result.ok
    assert any("Permission denied" in d.message for d in result.diagnostics)
