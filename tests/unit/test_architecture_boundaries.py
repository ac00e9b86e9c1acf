"""Layers point down only: entry points -> tools/ (thin MCP handlers) -> services/ (no mcp) -> memory/, targets/,
tasks/ -> base modules; kuzu only in memory/store.py, sentence_transformers only in memory/embedder.py. Every
import counts, the lazy ones inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import kope_mcp

PACKAGE = Path(kope_mcp.__file__).parent
# Processes' mains: the CLI and servers, the benchmark drivers, and the programs the sandbox runs.
ENTRY = {"cli", "server", "proxy", "http_server", "daemon", "demo", "demo_sources", "__main__", "bench",
         "reference_worker", "kernelbench_worker"}
LAYERS = {"tools": 3, "services": 2, "memory": 1, "targets": 1, "tasks": 1}
ONLY_IN = {"kuzu": {"memory/store.py"}, "sentence_transformers": {"memory/embedder.py"}}
MCP_FROM = 3  # tools/ and entry points


def rank(parts: tuple[str, ...]) -> int:
    head = parts[0].removesuffix(".py")
    return 4 if head in ENTRY else LAYERS.get(head, 0)


def imported(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def violations(package: Path) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        where, mine = "/".join(parts), rank(parts)
        for module in imported(path):
            top, *rest = module.split(".")
            if top == package.name and rest and rank(tuple(rest)) > mine:
                found.append(f"{where} imports {module} (a layer above it)")
            elif top in ONLY_IN and where not in ONLY_IN[top]:
                found.append(f"{where} imports {top} (only {', '.join(sorted(ONLY_IN[top]))} may)")
            elif top == "mcp" and mine < MCP_FROM:
                found.append(f"{where} imports {module} (mcp belongs to tools/ and the entry points)")
    return found


def test_no_layer_imports_upward_and_no_heavy_library_leaks_below_its_layer():
    assert violations(PACKAGE) == []


def test_the_boundary_check_catches_an_upward_import_and_a_leaked_library(tmp_path):
    package = tmp_path / "kope_mcp"
    for folder in ("memory", "services", "tools"):
        (package / folder).mkdir(parents=True)
    (package / "memory" / "store.py").write_text("import kuzu\n")
    (package / "memory" / "graph.py").write_text("def f():\n    from kope_mcp.services.workbench import Workbench\n")
    (package / "services" / "handler.py").write_text("from mcp.types import Tool\nimport kuzu\n")
    (package / "tools" / "ok.py").write_text("from mcp.types import Tool\nfrom kope_mcp.services import x\n")
    assert violations(package) == [
        "memory/graph.py imports kope_mcp.services.workbench (a layer above it)",
        "services/handler.py imports mcp.types (mcp belongs to tools/ and the entry points)",
        "services/handler.py imports kuzu (only memory/store.py may)",
    ]
