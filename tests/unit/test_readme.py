from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readmes_test_line_verbatim():
    readme = (ROOT / "README.md").read_text()
    test_line = next(line for line in readme.splitlines() if "pytest" in line and line.startswith("python3 -m venv"))
    assert test_line in (ROOT / ".ci" / "run").read_text()


def test_the_tasks_page_documents_every_packaged_task():
    from kope_mcp.tasks.registry import TaskRegistry

    page = (ROOT / "docs" / "tasks.md").read_text()
    assert all(f"`{t.id}`" in page for t in TaskRegistry.default().list())


def test_the_readme_is_a_front_door_and_every_link_in_it_and_the_docs_resolves():
    import re

    readme = (ROOT / "README.md").read_text()
    assert len(readme) <= 15_000, len(readme)
    for name in ("README.md", *(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))):
        text = re.sub(r"```.*?```|`[^`]*`", "", (ROOT / name).read_text(), flags=re.S)  # code is not a link
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if target.startswith(("http://", "https://")):
                continue
            assert ((ROOT / name).parent / target).exists(), f"{name}: a link to {target} leads nowhere"


def test_the_troubleshooting_table_lists_every_error_code():
    import re

    import kope_mcp.errors as errors_module
    from kope_mcp.errors import KopeError

    def subclasses(cls: type) -> list[type]:
        return [cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))]


    codes = {c.code for c in subclasses(KopeError)} - {"kope_error"}
    codes |= {"invalid_argument", "unknown_tool", "daemon_unavailable"}
    section = (ROOT / "docs" / "troubleshooting.md").read_text()
    listed = set(re.findall(r"`([a-z_]+)`", section))
    assert codes <= listed, sorted(codes - listed)
    assert errors_module.KopeError.code == "kope_error"


def _cells(row: str) -> int:
    """Cells of a table row: pipes outside `code` spans separate them."""
    count, in_code = 0, False
    for char in row.strip().strip("|"):
        if char == "`":
            in_code = not in_code
        elif char == "|" and not in_code:
            count += 1
    return count + 1


def test_every_table_is_whole_and_every_code_block_closed():
    for name in ("README.md", *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md")))):
        lines = (ROOT / name).read_text().splitlines()
        assert sum(line.lstrip().startswith("```") for line in lines) % 2 == 0, f"{name}: a code block is not closed"
        in_code = False
        for i, line in enumerate(lines):
            if line.lstrip().startswith("```"):
                in_code = not in_code
            if in_code or not line.startswith("|") or (i and lines[i - 1].startswith("|")):
                continue
            # A table starts here: a header, its separator, then rows with as many cells, up to a line without |.
            assert i + 1 < len(lines) and set(lines[i + 1].replace("|", "").strip()) <= set("-: "), \
                f"{name}:{i + 1}: a table row with no header above it (a blank line inside a table?)"
            width = _cells(line)
            j = i + 1
            while j < len(lines) and lines[j].startswith("|"):
                assert _cells(lines[j]) == width, f"{name}:{j + 1}: {_cells(lines[j])} cells, the header has {width}"
                j += 1


def test_the_tools_table_names_every_tool_and_every_input(tmp_path):
    import anyio
    from mcp import Client

    from kope_mcp.app.server import build_server
    from kope_mcp.settings import KopeSettings

    async def tools():
        async with Client(build_server(KopeSettings(home=tmp_path / "home", embeddings=False))) as c:
            return (await c.list_tools()).tools

    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Tools", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines() if line.startswith("| `")}
    for tool in anyio.run(tools):
        assert tool.name in rows, f"{tool.name} is not in the Tools table"
        inputs = rows[tool.name].split("|")[2]
        missing = [p for p in tool.input_schema.get("properties", {}) if f"`{p}" not in inputs]
        assert not missing, f"{tool.name}: inputs {missing} are not in the Tools table"
