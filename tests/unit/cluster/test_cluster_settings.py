"""The cluster's settings and its failure paths that need no Ray cluster: tokens, worker names, a head that does
not answer, and a server without a cluster that never imports Ray."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kope_mcp.cluster.config import (
    ClusterSettingError,
    DriverIdentity,
    check_worker_name,
    driver_identity,
    token_path,
)
from kope_mcp.errors import DeviceLostError
from kope_mcp.services.workbench import Workbench
from tests.conftest import VECTOR_ADD_OK, make_settings


def test_a_missing_token_is_refused_with_how_to_make_one(tmp_path):
    with pytest.raises(ClusterSettingError, match=r"^invalid_setting: no cluster token at .*chmod 600"):
        token_path(str(tmp_path / "absent"))


def test_a_token_other_users_can_read_is_refused(tmp_path):
    token = tmp_path / "token"
    token.write_text("x" * 64)
    token.chmod(0o644)
    with pytest.raises(ClusterSettingError, match="is mode 0644: other users could join"):
        token_path(str(token))
    token.chmod(0o600)
    assert token_path(str(token)) == token


@pytest.mark.parametrize("name", ["", "a b", "x" * 41, "gpu/box", "é"])
def test_a_worker_name_that_cannot_be_part_of_a_device_id_is_refused(name):
    with pytest.raises(ClusterSettingError, match="is not 1-40 letters"):
        check_worker_name(name)


def test_a_server_whose_cluster_does_not_answer_keeps_its_own_devices_and_says_so(tmp_path):
    token = tmp_path / "token"
    token.write_text("x" * 64)
    token.chmod(0o600)
    settings = make_settings(tmp_path / "home").model_copy(update={"cluster": "127.0.0.1:1",
                                                                   "cluster_token": str(token)})
    bench = Workbench(settings)
    try:
        listed = bench.list_devices()
        assert "c" in {d.id for d in listed.devices}
        assert listed.warnings and "did not answer" in listed.warnings[0]
        started = time.monotonic()
        with pytest.raises(DeviceLostError, match=r"^device_lost: the cluster at 127.0.0.1:1 did not answer"):
            bench.compile_kernel("vector_add", VECTOR_ADD_OK, device="c@gpu-box")
        assert time.monotonic() - started < 30
        assert bench.compile_kernel("vector_add", VECTOR_ADD_OK).ok  # this machine's own backend still works
    finally:
        bench.store.close()


@pytest.mark.parametrize("problem", ["missing", "open to others"])
def test_a_token_problem_never_stops_the_server_and_every_cluster_call_names_it_then_backs_off(tmp_path, problem):
    token = tmp_path / "token"
    if problem == "open to others":
        token.write_text("x" * 64)
        token.chmod(0o644)
    settings = make_settings(tmp_path / "home").model_copy(update={"cluster": "127.0.0.1:1",
                                                                   "cluster_token": str(token)})
    bench = Workbench(settings)  # the server starts
    try:
        listed = bench.list_devices()
        assert "c" in {d.id for d in listed.devices}
        assert any(str(token) in w and ("no cluster token" in w or "mode 0644" in w) for w in listed.warnings)
        with pytest.raises(DeviceLostError, match=r"cannot be used: invalid_setting: .*tried again in \d+ s"):
            bench.compile_kernel("vector_add", VECTOR_ADD_OK, device="c@gpu-box")
        assert bench.compile_kernel("vector_add", VECTOR_ADD_OK).ok
    finally:
        bench.store.close()


def test_without_a_kope_token_setting_rays_own_token_path_is_used_then_the_default(tmp_path, monkeypatch):
    token = tmp_path / "ray-token"
    token.write_text("x" * 64)
    token.chmod(0o600)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    assert token_path("") == token
    assert token_path(str(token)) == token
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "absent"))
    with pytest.raises(ClusterSettingError, match=r"absent \(RAY_AUTH_TOKEN_PATH\)"):
        token_path("")
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ClusterSettingError, match=r"\.kope-cluster-token \(the default\)"):
        token_path("")


@pytest.mark.slow
def test_a_server_without_a_cluster_never_imports_ray(tmp_path):
    probe = ("import sys; from pathlib import Path; from kope_mcp.services.workbench import Workbench; "
             "from kope_mcp.settings import KopeSettings; "
             f"b = Workbench(KopeSettings.from_env(home=Path({str(tmp_path / 'home')!r}), embeddings=False)); "
             "b.list_devices(); b.store.close(); print('ray' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "False"


def test_the_token_setting_reaches_the_server_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KOPE_CLUSTER", " 10.0.0.5:6379 ")
    monkeypatch.setenv("KOPE_CLUSTER_TOKEN", str(tmp_path / "t"))
    settings = make_settings(Path(tmp_path / "home"))
    assert settings.cluster == "10.0.0.5:6379" and settings.cluster_token == str(tmp_path / "t")
    assert settings.client_visible()["KOPE_CLUSTER"] == "10.0.0.5:6379"


def test_the_driver_child_runs_as_the_servers_user_with_a_warning_when_the_local_node_is_that_users(tmp_path):
    socket_file = tmp_path / "raylet"
    socket_file.write_text("")
    identity = driver_identity(socket_file, os.geteuid(), tmp_path)
    assert identity.uid is None and identity.command(["python"]) == ["python"]
    assert "runs as the server's own user" in identity.warning and str(tmp_path) not in identity.warning
    assert driver_identity(tmp_path / "absent", os.geteuid(), tmp_path) == DriverIdentity(None, None, "")


def test_the_driver_childs_environment_carries_the_token_by_value_and_nothing_of_the_server(tmp_path):
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    env = DriverIdentity(1234, 1234, "").environment(token, {"KOPE_HOME": "/h", "KOPE_HTTP_TOKEN": "t",
                                                             "RAY_AUTH_TOKEN_PATH": "/x", "PATH": "/bin"})
    assert env["RAY_AUTH_TOKEN"] == "secret-token" and env["RAY_AUTH_MODE"] == "token" and env["HOME"] == "/"
    assert "RAY_AUTH_TOKEN_PATH" not in env and not any(k.startswith("KOPE_") for k in env)
    assert env["PATH"] == "/bin" and env["RAY_worker_niceness"] == "0"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_a_root_server_runs_its_driver_child_as_the_nodes_user_who_cannot_read_its_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "http-token").write_text("server secret")
    socket_file = tmp_path / "raylet"
    socket_file.write_text("")
    os.chown(socket_file, 65534, 65534)  # a node started by another user
    identity = driver_identity(socket_file, 0, home)
    assert (identity.uid, identity.gid, identity.warning) == (65534, 65534, "")
    probe = ("import os, sys\ntry:\n    open(sys.argv[1]).read(); print('read')\nexcept PermissionError:\n"
             "    print('refused')\nprint(os.getuid(), sorted(k for k in os.environ if k.startswith('KOPE_')))")
    run = subprocess.run(identity.command(["/usr/bin/env", "-S", "python3", "-c", probe, str(home / "http-token")]),
                         env=identity.environment(None, {**os.environ, "KOPE_HOME": str(home)}), cwd="/",
                         capture_output=True, text=True, timeout=60)
    assert run.stdout.split("\n")[:2] == ["refused", "65534 []"], run.stderr
    home.chmod(0o755)
    assert "KOPE_HOME is open to other users" in driver_identity(socket_file, 0, home).warning


@pytest.mark.parametrize("kind, detail", [
    ("OUT_OF_MEMORY", ""),
    ("OutOfMemoryError", "Task was killed due to the node running low on memory."),
    ("RayActorError", "The actor died unexpectedly before finishing this task.\nMemory on the node (OOM) ..."),
])
def test_a_call_lost_to_rays_memory_monitor_says_so(kind, detail):
    from kope_mcp.cluster.driver import OOM, lost_reason

    assert lost_reason(kind, detail) == OOM and "ran short of memory" in OOM


def test_any_other_lost_call_keeps_rays_first_line_or_its_kind():
    from kope_mcp.cluster.driver import lost_reason

    assert lost_reason("RayActorError", "The actor died.\ndetails") == "The actor died."
    assert lost_reason("ACTOR_DIED", "") == "actor died"
