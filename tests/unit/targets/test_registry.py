"""Targets come from the `kope_mcp.targets` entry-point group; a broken plug-in is skipped, not fatal; a backend
that cannot work here is refused with what is missing."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

import kope_mcp.targets.registry as registry_module
import kope_mcp.targets.triton as triton_module
from kope_mcp.errors import TargetUnavailableError, TaskNotOnTargetError, UnknownBackendError
from kope_mcp.targets.c import CpuCTarget
from kope_mcp.targets.registry import load_targets, target_classes
from tests.conftest import VECTOR_ADD_OK
from tests.fake_target import FakeNumpyTarget


def entry(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=registry_module.ENTRY_POINT_GROUP)


def test_the_built_ins_are_the_classes_their_entry_points_name():
    classes = target_classes()
    assert classes["c"] is CpuCTarget
    assert classes["triton"].__name__ == "TritonTarget" and classes["cuda"].__name__ == "CudaTarget"


def test_a_plug_in_that_does_not_import_or_is_not_a_target_is_skipped(monkeypatch, caplog):
    found = [entry("c", "kope_mcp.targets.c:CpuCTarget"), entry("broken", "no_such_module_xyz:Target"),
             entry("wrong", "kope_mcp.settings:KopeSettings"), entry("fake", "tests.fake_target:FakeNumpyTarget")]
    monkeypatch.setattr(registry_module, "entry_points", lambda group: found)
    classes = target_classes()
    assert set(classes) == {"c", "fake"} and classes["fake"] is FakeNumpyTarget
    assert "no_such_module_xyz" in caplog.text and "not a kope_mcp.targets.base.Target" in caplog.text


def test_extra_targets_join_the_registered_ones(tmp_path):
    from tests.conftest import make_settings

    targets = load_targets(make_settings(tmp_path), extra=[FakeNumpyTarget])
    assert {"c", "triton", "cuda", "fake"} <= set(targets)


def test_an_unknown_backend_lists_the_valid_ones(workbench):
    with pytest.raises(UnknownBackendError, match="valid backends: c, cuda, triton"):
        workbench.compile_kernel("vector_add", VECTOR_ADD_OK, backend="opencl")


def test_a_backend_whose_toolchain_is_missing_says_what_to_install(workbench, monkeypatch):
    monkeypatch.setattr(triton_module, "triton_version", lambda: None)
    with pytest.raises(TargetUnavailableError, match=r"^target_unavailable: .*pip install -e '\.\[triton\]'"):
        workbench.compile_kernel("vector_add", "def kernel(a, b, out, n): pass\n", backend="triton")


def test_a_task_without_a_version_for_the_backend_names_the_backends_it_has(workbench):
    if not workbench.targets["triton"].status().compile:
        pytest.skip("triton is not installed")
    with pytest.raises(TaskNotOnTargetError, match="backends for it: c"):
        workbench.compile_kernel("conv2d", "def kernel(): pass\n", backend="triton")


def test_a_session_stays_on_one_backend(workbench):
    from kope_mcp.errors import TargetMismatchError

    if not workbench.targets["triton"].status().compile:
        pytest.skip("triton is not installed")
    first = workbench.compile_kernel("vector_add", VECTOR_ADD_OK)
    source = workbench.targets["triton"].baseline_source(workbench.tasks.get("vector_add"))
    with pytest.raises(TargetMismatchError, match="start a session for backend 'triton'"):
        workbench.compile_kernel("vector_add", source, backend="triton", session_id=first.session_id)
