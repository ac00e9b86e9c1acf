import subprocess
import sys

import pytest

from kope_mcp.app.cli import main


def test_tasks_lists_the_suite(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert "vector_add" in out and "matmul" in out and "task(s)" in out


def test_tasks_show_prints_prototype_reference_and_baseline(capsys):
    assert main(["tasks", "show", "softmax"]) == 0
    out = capsys.readouterr().out
    assert "void kernel(const float *x, float *y, int64_t rows, int64_t cols);" in out
    assert "def reference" in out and "expf" in out


def test_tasks_show_unknown_id_lists_valid_ids(capsys):
    assert main(["tasks", "show", "nope"]) == 2
    assert "unknown_task" in capsys.readouterr().err


def test_doctor_reports_compiler_and_sandbox(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "gcc" in out and "Sandbox" in out and "ISA" in out
    scratch = next(line for line in out.splitlines() if line.startswith("Scratch"))
    assert "mount table" in scratch


def test_python_dash_m_entry_point_works():
    out = subprocess.run([sys.executable, "-m", "kope_mcp", "tasks", "--family", "scan"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert "prefix_sum" in out


def test_memory_stats_show_export_and_import(tmp_path, monkeypatch, capsys):
    import json

    from kope_mcp.services.workbench import Workbench
    from tests.conftest import VECTOR_ADD_OK, make_settings

    home = tmp_path / "home"
    workbench = Workbench(make_settings(home))
    compiled = workbench.compile_kernel("vector_add", VECTOR_ADD_OK, strategy="plain loop")
    workbench.store.close()  # not the memory: its read index was not closed cleanly
    monkeypatch.setenv("KOPE_HOME", str(home))
    assert main(["memory", "stats"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["counts"]["Attempt"] == 1 and stats["read_index"].startswith("stale")
    assert stats["read_index_bytes"] > 0 and stats["vectors_bytes"] == 0
    assert main(["memory", "show", compiled.kernel_id]) == 0
    assert json.loads(capsys.readouterr().out)["attempt"]["strategy"] == "plain loop"
    assert main(["memory", "show", "k-nope"]) == 2
    assert "unknown_experience" in capsys.readouterr().err
    dump = tmp_path / "memory.jsonl"
    assert main(["memory", "export", str(dump)]) == 0
    assert json.loads(dump.read_text().splitlines()[0])["format"] == "kope-memory"
    monkeypatch.setenv("KOPE_HOME", str(tmp_path / "other"))
    assert main(["memory", "import", str(dump)]) == 0
    assert "attempt" in capsys.readouterr().out
    assert main(["memory", "import", str(dump)]) == 0
    assert "added nothing" in capsys.readouterr().out
    not_export = tmp_path / "x.jsonl"
    not_export.write_text('{"hello": 1}\n')
    assert main(["memory", "import", str(not_export)]) == 2
    assert "invalid_export" in capsys.readouterr().err


def test_a_relative_kope_home_works_from_the_sandbox(tmp_path, monkeypatch):
    # Kernels run with another working directory: the home must be made absolute before anything uses it.
    from kope_mcp.services.workbench import Workbench
    from kope_mcp.settings import KopeSettings
    from tests.conftest import VECTOR_ADD_OK

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KOPE_HOME", "relative-home")
    settings = KopeSettings.from_env(test_timeout_s=8.0, embeddings=False)
    assert settings.home == tmp_path / "relative-home"
    workbench = Workbench(settings)
    compiled = workbench.compile_kernel("vector_add", VECTOR_ADD_OK)
    assert workbench.run_tests(compiled.kernel_id).passed
    workbench.store.close()


def test_version_prints_the_package_version(capsys):
    import kope_mcp

    try:
        main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert capsys.readouterr().out.strip() == f"kope-mcp {kope_mcp.__version__}"


def test_doctor_lists_every_target_and_fails_when_the_c_compiler_does_not_run(monkeypatch, capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "Target     c " in out and "Target     triton " in out and "Target     cuda " in out
    monkeypatch.setenv("KOPE_CC", "no-such-cc-kope")
    assert main(["doctor"]) == 1
    assert "The c backend cannot compile" in capsys.readouterr().err


def test_bad_ports_and_token_files_end_in_one_line_not_a_traceback(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["serve", "--transport", "http", "--port", "99999"])
    assert "not a port number" in capsys.readouterr().err
    empty = tmp_path / "token"
    empty.write_text("\n")
    assert main(["serve", "--transport", "http", "--token-file", str(empty)]) == 2
    assert "is empty" in capsys.readouterr().err
    assert main(["serve", "--transport", "http", "--token-file", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "cannot read the token file" in err and "Traceback" not in err


def test_daemon_stop_and_status_on_an_unused_home_create_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KOPE_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    assert main(["daemon", "stop"]) == 0
    assert main(["daemon", "status"]) == 1
    assert "nothing serves" in capsys.readouterr().out
    assert list((tmp_path / "home").iterdir()) == []


@pytest.mark.slow
def test_a_failed_demo_ends_in_one_line_and_names_the_daemon_it_leaves(tmp_path):
    import os

    from kope_mcp.app import daemon

    env = {**os.environ, "KOPE_HOME": str(tmp_path / "home"), "KOPE_CC": "no-such-cc-kope"}
    try:
        done = subprocess.run([sys.executable, "-m", "kope_mcp", "demo"], env=env, capture_output=True, text=True,
                              timeout=180, check=False)
    finally:
        daemon.stop(tmp_path / "home")
    assert done.returncode == 1
    assert "demo: compile_kernel failed: target_unavailable:" in done.stderr
    assert "Traceback" not in done.stderr and "kope daemon stop" in done.stderr


@pytest.mark.parametrize(("name", "value", "says"), [
    ("KOPE_PROFILE_S", "abc", "a positive number of seconds"), ("KOPE_PROFILE_S", "-1", "a positive number"),
    ("KOPE_MAX_SOURCE_BYTES", "1.5e3", "a positive whole number of bytes"),
    ("KOPE_EMBEDDINGS", "maybe", "not on or off"),
    ("KOPE_REMEASURE_S", "soon", "a positive number of seconds, or 0 for never"),
])
def test_a_wrong_setting_is_one_line_that_names_it_and_what_is_valid(monkeypatch, capsys, name, value, says):
    monkeypatch.setenv(name, value)
    for command in (["doctor"], ["demo"], ["memory", "stats"], ["tasks"]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith(f"error: invalid_setting: {name}={value!r}") and says in err


def test_memory_stats_without_a_server_says_why_semantic_search_is_off(tmp_path, monkeypatch, capsys):
    import json

    monkeypatch.setenv("KOPE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KOPE_EMBEDDINGS", raising=False)
    assert main(["memory", "stats"]) == 0
    assert json.loads(capsys.readouterr().out)["semantic_search"].startswith("not loaded by `kope memory`")


@pytest.mark.slow
def test_a_gpu_demo_without_a_gpu_says_so_in_one_line(tmp_path):
    import os

    from kope_mcp.app import daemon
    from kope_mcp.targets.gpu import detect_gpu

    if detect_gpu() is not None:
        pytest.skip("this machine has a GPU: the demo runs there (tests/e2e/test_gpu_on_device.py)")
    env = {**os.environ, "KOPE_HOME": str(tmp_path / "home"), "KOPE_EMBEDDINGS": "off"}
    try:
        done = subprocess.run([sys.executable, "-m", "kope_mcp", "demo", "--backend", "cuda"], env=env,
                              capture_output=True, text=True, timeout=180, check=False)
    finally:
        daemon.stop(tmp_path / "home")
    assert done.returncode == 1
    assert "demo: the cuda backend cannot time kernels on this server:" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_an_unusable_home_is_one_line_with_its_code_and_doctor_fails_on_it(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("KOPE_HOME", str(blocker / "kope"))
    assert main(["doctor"]) == 1
    out, err = capsys.readouterr()
    assert "UNUSABLE" in out and f"{blocker} is a file, not a folder" in out
    assert err.strip().splitlines()[-1].startswith("Nothing can be served from this home: home_unusable:")
    for argv in (["serve", "--transport", "http"], ["daemon", "run"], ["memory", "stats"], ["tasks", "add", "x"]):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and err.startswith("error: home_unusable: KOPE_HOME "), (argv, err)
        assert "Traceback" not in err and "Errno" not in err
    assert not (blocker / "kope").exists()
