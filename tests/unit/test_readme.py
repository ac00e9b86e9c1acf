from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readmes_test_line_verbatim():
    readme = (ROOT / "README.md").read_text()
    test_line = next(line for line in readme.splitlines() if "pytest" in line and line.startswith("python3 -m venv"))
    assert test_line in (ROOT / ".ci" / "run").read_text()


def test_readme_documents_every_packaged_task():
    from kope_mcp.tasks.registry import TaskRegistry

    readme = (ROOT / "README.md").read_text()
    assert all(f"`{t.id}`" in readme for t in TaskRegistry.default().list())
