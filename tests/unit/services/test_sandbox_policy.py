"""Where kernels cannot be isolated the workbench refuses, unless the user opted out; KOPE_HOME stays private."""

import stat

import pytest

import kope_mcp.services.workbench as workbench_module
from kope_mcp.errors import SandboxUnavailableError
from kope_mcp.runtime.sandbox import UNSAFE_ENV, Layer, SandboxCapabilities
from kope_mcp.services.workbench import Workbench
from tests.conftest import VECTOR_ADD_OK, make_settings

NOTHING = SandboxCapabilities("none", None, (Layer("rlimits", True, "prlimit"), Layer("bubblewrap", False, "absent")),
                              missing="bubblewrap (bwrap): install it")


@pytest.fixture
def no_isolation(monkeypatch):
    monkeypatch.setattr(workbench_module, "capabilities", lambda: NOTHING)


def test_without_isolation_every_kernel_tool_refuses_and_says_what_is_missing(no_isolation, tmp_path, registry):
    bench = Workbench(make_settings(tmp_path / "home"), registry)
    with pytest.raises(SandboxUnavailableError) as info:
        bench.compile_kernel("vector_add", VECTOR_ADD_OK)
    message = str(info.value)
    assert message.startswith("sandbox_unavailable:") and "bubblewrap" in message and UNSAFE_ENV in message
    assert bench.store.counts()["Session"] == 0  # nothing half-recorded


def test_the_opt_out_is_explicit_and_every_result_says_so(no_isolation, monkeypatch, workbench):
    monkeypatch.setenv(UNSAFE_ENV, "1")
    compiled = workbench.compile_kernel("vector_add", VECTOR_ADD_OK + "\n// unsafe\n")
    assert any("WITHOUT isolation" in w for w in compiled.warnings)


def test_a_home_readable_by_others_is_made_private_with_a_warning(tmp_path):
    home = tmp_path / "home"
    (home / "builds").mkdir(parents=True)
    home.chmod(0o755)
    (home / "builds").chmod(0o755)
    settings = make_settings(home)
    warnings = settings.ensure_home()
    assert len(warnings) == 2 and "0755" in warnings[0]
    for path in (home, home / "builds", home / "scratch"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert settings.ensure_home() == []
