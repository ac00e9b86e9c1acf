import subprocess
import sys

from kope_mcp.cli import main


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


def test_python_dash_m_entry_point_works():
    out = subprocess.run([sys.executable, "-m", "kope_mcp", "tasks", "--family", "scan"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert "prefix_sum" in out
