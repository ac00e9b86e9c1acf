"""A running server's task catalogue follows the user's task folders: added, edited and removed tasks are served
from the next look, half-copied folders never."""

import shutil
from pathlib import Path

import pytest

from kope_mcp.errors import UnknownTaskError
from kope_mcp.services.task_admin import install_folder
from kope_mcp.tasks.registry import TaskRegistry

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tasks" / "axpby"


def test_a_task_added_to_the_home_is_served_without_a_restart_and_a_removed_one_is_gone(tmp_path):
    registry = TaskRegistry.default(tmp_path / "home", watch=0.0)  # 0: look on every call
    with pytest.raises(UnknownTaskError):
        registry.get("axpby")
    assert registry.problems == []  # KOPE_HOME/tasks before the first add is no problem
    install_folder(EXAMPLE, tmp_path / "home" / "tasks" / "axpby")
    assert registry.get("axpby").spec.family == "elementwise"
    assert "axpby" in {t.id for t in registry.list("elementwise")}
    shutil.rmtree(tmp_path / "home" / "tasks" / "axpby")
    with pytest.raises(UnknownTaskError):
        registry.get("axpby")


def test_an_edited_task_file_is_read_again(tmp_path):
    folder = tmp_path / "tasks" / "axpby"
    shutil.copytree(EXAMPLE, folder)
    registry = TaskRegistry.default(tmp_path, watch=0.0)
    before = registry.get("axpby").spec.level
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace(f"level = {before}", f"level = {before % 4 + 1}"))
    assert registry.refresh()
    assert registry.get("axpby").spec.level == before % 4 + 1
    assert not registry.refresh()  # nothing changed since


def test_a_folder_being_installed_is_never_loaded(tmp_path):
    staged = tmp_path / "tasks" / ".axpby.new-123"
    shutil.copytree(EXAMPLE, staged)
    registry = TaskRegistry.default(tmp_path, watch=0.0)
    with pytest.raises(UnknownTaskError):
        registry.get("axpby")
    assert registry.problems == []


def test_without_watch_the_catalogue_is_read_once(tmp_path):
    registry = TaskRegistry.default(tmp_path)
    shutil.copytree(EXAMPLE, tmp_path / "tasks" / "axpby")
    with pytest.raises(UnknownTaskError):
        registry.get("axpby")


def test_a_replaced_task_is_swapped_whole(tmp_path):
    target = tmp_path / "tasks" / "axpby"
    assert install_folder(EXAMPLE, target) is False
    assert install_folder(EXAMPLE, target) is True
    assert sorted(p.name for p in target.parent.iterdir()) == ["axpby"]  # no staged or retired copy left
