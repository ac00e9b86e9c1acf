"""A task folder or KernelBench problem is someone else's Python: adding or importing one runs it only in the
sandbox, so its top-level code reads nothing of the user's and leaves nothing outside, and a failure says what
the file did. Run as root and as an ordinary user (`.ci/security-as-user`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kope_mcp.errors import InvalidTaskError
from kope_mcp.services.task_admin import add_task
from kope_mcp.tasks.registry import TaskRegistry
from tests.conftest import make_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "axpby"
PROBLEM = Path(__file__).resolve().parents[1] / "fixtures" / "kernelbench" / "level1" / \
    "1_Square_matrix_multiplication_.py"


def _prying(planted: Path, secret: Path) -> str:
    """Top-level code that plants a file beside the user's and reads a secret; its result shifts the reference's
    answer by 1000 when the secret was readable (so the task's own baseline then fails its cases)."""
    return (f"import os as _os\n_SHIFT = 0.0\n"
            f"try:\n    open({str(planted)!r}, 'w').write('pwned')\nexcept OSError:\n    pass\n"
            f"try:\n    open({str(secret)!r}).read()\n    _SHIFT = 1000.0\nexcept OSError:\n    pass\n")


def test_adding_a_task_whose_reference_pries_runs_it_only_in_the_sandbox(tmp_path, user_secret):
    folder = tmp_path / "axpby"
    shutil.copytree(EXAMPLE, folder)
    planted = tmp_path / "planted-by-reference"
    reference = (folder / "reference.py").read_text()
    (folder / "reference.py").write_text(_prying(planted, user_secret) + reference.replace(
        "return np.float64(alpha)", "return _SHIFT + np.float64(alpha)"))
    settings = make_settings(tmp_path / "home")
    added = add_task(settings, folder)  # its baseline passed: the secret was not readable where it ran
    assert added.baseline_cases_passed > 0
    assert not planted.exists()
    task = TaskRegistry.default(settings.home).get("axpby")  # loading it as the server does runs nothing
    assert not task.trusted and task.reference_fn is None
    assert not planted.exists()


def test_a_reference_that_fails_at_import_is_refused_with_what_it_raised(tmp_path):
    folder = tmp_path / "axpby"
    shutil.copytree(EXAMPLE, folder)
    (folder / "baseline.c").unlink()  # its reference is run directly, twice per case
    (folder / "reference.py").write_text("import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=2)\n"
                                         + (EXAMPLE / "reference.py").read_text())
    with pytest.raises(InvalidTaskError) as raised:
        add_task(make_settings(tmp_path / "home"), folder)
    assert str(raised.value).startswith(f"invalid_task: {folder / 'reference.py'}: importing it raised OSError")
    assert "unreachable" in str(raised.value)  # no network where it ran


@pytest.mark.slow
def test_importing_a_kernelbench_problem_that_pries_runs_it_only_in_the_sandbox(tmp_path, user_secret):
    from kope_mcp.services.kernelbench_import import import_kernelbench

    planted = tmp_path / "planted-by-problem"
    problem = tmp_path / "1_Square_matrix_multiplication_.py"
    source = PROBLEM.read_text().replace("N = 2048", "N = 256")
    problem.write_text(_prying(planted, user_secret) + source.replace(
        "return torch.matmul(A, B)", "return torch.matmul(A, B) + _SHIFT"))
    settings = make_settings(tmp_path / "home")
    report = import_kernelbench(settings, [problem])
    assert [p.task_id for p in report.imported] == ["kb_1_square_matrix_multiplication"], report.skipped
    assert not planted.exists()
    task = TaskRegistry.default(settings.home).get("kb_1_square_matrix_multiplication")
    assert not task.trusted
