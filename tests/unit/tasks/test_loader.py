"""User task folders: loaded like packaged ones; a broken folder names the file and field, and is skipped."""

import shutil
from pathlib import Path

import pytest

from kope_mcp.errors import InvalidTaskError
from kope_mcp.tasks.loader import load_task
from kope_mcp.tasks.registry import SUITE_DIR, TaskRegistry


def copy_task(tmp_path: Path, task_id: str, new_id: str) -> Path:
    folder = tmp_path / new_id
    shutil.copytree(SUITE_DIR / task_id, folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace(f'id = "{task_id}"', f'id = "{new_id}"'))
    return folder


def test_a_copied_folder_loads_as_a_new_task(tmp_path):
    task = load_task(copy_task(tmp_path, "relu", "my_relu"))
    assert task.id == "my_relu"
    assert task.spec.prototype == "void kernel(const float *x, float *y, int64_t n)"


def test_missing_file_is_named(tmp_path):
    folder = copy_task(tmp_path, "relu", "my_relu")
    (folder / "reference.py").unlink()
    with pytest.raises(InvalidTaskError, match=r"missing reference\.py"):
        load_task(folder)


def test_a_task_without_a_baseline_loads_and_is_measured_against_its_reference(tmp_path):
    folder = copy_task(tmp_path, "relu", "my_relu")
    (folder / "baseline.c").unlink()
    assert load_task(folder).baseline_source is None


def test_bad_field_names_file_and_field(tmp_path):
    folder = copy_task(tmp_path, "relu", "my_relu")
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("level = 1", "level = 9"))
    with pytest.raises(InvalidTaskError, match=r"task\.toml: field level"):
        load_task(folder)


def test_reference_with_wrong_parameters_is_refused(tmp_path):
    folder = copy_task(tmp_path, "relu", "my_relu")
    (folder / "reference.py").write_text("def reference(x):\n    return x\n")
    with pytest.raises(InvalidTaskError, match="non-output arguments"):
        load_task(folder)


def test_reference_that_raises_on_import_is_reported(tmp_path):
    folder = copy_task(tmp_path, "relu", "my_relu")
    (folder / "reference.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(InvalidTaskError, match="RuntimeError: boom"):
        load_task(folder)


def test_registry_skips_invalid_folders_and_keeps_serving_the_rest(tmp_path):
    copy_task(tmp_path, "relu", "good_one")
    bad = copy_task(tmp_path, "relu", "bad_one")
    (bad / "task.toml").write_text("id = [")
    registry = TaskRegistry([SUITE_DIR, tmp_path])
    assert registry.get("good_one").id == "good_one"
    assert registry.get("relu").id == "relu"
    assert any("bad_one" in p and "not valid TOML" in p for p in registry.problems)
