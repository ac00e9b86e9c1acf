"""`kope tasks add`: a user's task folder is checked end to end, installed, and served like a packaged one."""

import shutil
from pathlib import Path

import anyio
import pytest
from mcp import Client

from kope_mcp.app.cli import main
from kope_mcp.app.server import build_server
from kope_mcp.errors import InvalidTaskError
from kope_mcp.services.task_admin import add_task
from tests.conftest import make_settings

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tasks" / "axpby"


@pytest.mark.slow
def test_the_worked_example_is_installed_and_served_through_mcp(tmp_path):
    settings = make_settings(tmp_path / "home")
    added = add_task(settings, EXAMPLE)
    # Its 5 cases and the one drawn near the profiling size.
    assert added.task_id == "axpby" and added.baseline_cases_passed == 6
    assert (tmp_path / "home" / "tasks" / "axpby" / "task.toml").is_file()

    async def body():
        async with Client(build_server(settings)) as client:
            listing = await client.call_tool("list_tasks", {"family": "elementwise"})
            assert "axpby" in {line.split(" ", 1)[0] for line in listing.structured_content["tasks"]}
            task = (await client.call_tool("get_task", {"task_id": "axpby"})).structured_content
            assert task["prototype"] == ("void kernel(float alpha, float beta, const float *x, const float *y, "
                                         "float *out, int64_t n)")
            compiled = (await client.call_tool("compile_kernel", {
                "task_id": "axpby", "source": task["baseline_source"], "flags": ["-O3"]})).structured_content
            assert compiled["ok"]
            tested = (await client.call_tool("run_tests", {"kernel_id": compiled["kernel_id"]})).structured_content
            assert tested["passed"], tested["message"]
            profile = await client.call_tool("profile_kernel", {"kernel_id": compiled["kernel_id"]})
            assert not profile.is_error and profile.structured_content["speedup_vs_baseline"] > 0

    anyio.run(body)


def test_a_baseline_that_fails_its_own_cases_is_refused_with_the_file(tmp_path):
    folder = tmp_path / "axpby"
    shutil.copytree(EXAMPLE, folder)
    baseline = folder / "baseline.c"
    baseline.write_text(baseline.read_text().replace("beta * y[i]", "beta * y[0]"))
    with pytest.raises(InvalidTaskError, match=r"baseline\.c: fails the task's own cases \(mismatch\)"):
        add_task(make_settings(tmp_path / "home"), folder)
    assert not (tmp_path / "home" / "tasks" / "axpby").exists()


def test_a_packaged_id_cannot_be_shadowed(tmp_path):
    folder = tmp_path / "relu"
    shutil.copytree(EXAMPLE, folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace('id = "axpby"', 'id = "relu"'))
    with pytest.raises(InvalidTaskError, match="field id: 'relu' is a packaged task"):
        add_task(make_settings(tmp_path / "home"), folder)


def test_the_cli_adds_refuses_a_second_add_and_replaces_on_request(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KOPE_HOME", str(tmp_path / "home"))
    assert main(["tasks", "add", str(EXAMPLE)]) == 0
    assert "added task axpby" in capsys.readouterr().out
    assert main(["tasks", "add", str(EXAMPLE)]) == 2
    assert "--replace" in capsys.readouterr().err
    assert main(["tasks", "add", str(EXAMPLE), "--replace"]) == 0
    assert main(["tasks", "--family", "elementwise"]) == 0
    assert "axpby" in capsys.readouterr().out
