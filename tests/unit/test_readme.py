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


def test_the_troubleshooting_table_lists_every_error_code():
    import re

    import kope_mcp.errors as errors_module
    from kope_mcp.errors import KopeError

    def subclasses(cls: type) -> list[type]:
        return [cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))]

    import kope_mcp.http_server
    import kope_mcp.services.experience
    import kope_mcp.services.memory_admin  # noqa: F401  (defines invalid_export)

    codes = {c.code for c in subclasses(KopeError)} - {"kope_error"}
    codes |= {"invalid_argument", "unknown_tool", "daemon_unavailable"}
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`([a-z_]+)`", section))
    assert codes <= listed, sorted(codes - listed)
    assert errors_module.KopeError.code == "kope_error"
