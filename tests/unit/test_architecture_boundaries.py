"""Layers point down only: entry points (app/) -> tools/ (thin MCP handlers) -> services/ (the workflow, no mcp) and
experience/ (context selection, beside it) -> memory/,
targets/, tasks/, cluster/ -> the execution runtime (runtime/) -> base modules; kuzu only in memory/store.py,
sentence_transformers only in memory/embedder.py, ray only in cluster/. Every import counts, the lazy ones inside
functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import kope_mcp

PACKAGE = Path(kope_mcp.__file__).parent
# Processes' mains: app/ (the CLI, the servers, the daemon, the demo, the sandboxed workers' mains), the benchmark
# drivers, and ``python -m kope_mcp``.
ENTRY = {"app", "bench", "__main__"}
LAYERS = {"tools": 4, "services": 3, "experience": 3, "memory": 2, "targets": 2, "tasks": 2, "cluster": 2, "runtime": 1}
ONLY_IN = {"kuzu": {"memory/store.py"}, "sentence_transformers": {"memory/embedder.py"},
           "ray": {"cluster/driver.py", "cluster/worker.py"}}
MCP_FROM = 4  # tools/ and entry points


def rank(parts: tuple[str, ...]) -> int:
    head = parts[0].removesuffix(".py")
    return 5 if head in ENTRY else LAYERS.get(head, 0)


def imported(path: Path, with_names: bool = False) -> list[str]:
    """Modules ``path`` imports; ``with_names`` adds ``pkg.name`` for ``from pkg import name`` (a submodule)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            if with_names:
                found += [f"{node.module}.{alias.name}" for alias in node.names]
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


def import_cycles(package: Path) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop (lazy imports count)."""
    modules = {".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = set()
        for module in imported(path, with_names=True):
            while module and module not in modules:
                module = module.rpartition(".")[0]
            if module and module not in (name, package.name):
                graph[name].add(module)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            group = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in graph:
        if node not in order:
            visit(node)
    return cycles


def test_no_module_imports_itself_around_a_loop():
    assert import_cycles(PACKAGE) == []


def test_the_cycle_check_finds_a_loop_through_a_lazy_import(tmp_path):
    package = tmp_path / "kope_mcp"
    package.mkdir()
    (package / "a.py").write_text("from kope_mcp.b import x\n")
    (package / "b.py").write_text("x = 1\ndef f():\n    from kope_mcp import a\n")
    (package / "c.py").write_text("from kope_mcp.a import x\n")
    assert import_cycles(package) == [["kope_mcp.a", "kope_mcp.b"]]


# The memory's one front door: only ExperienceMemory (and the parts it is built from) touches its store, its
# embedder and its vectors; every other module reaches them through it.
MEMORY_INSIDES = ("kope_mcp.memory.store", "kope_mcp.memory.embedder", "kope_mcp.memory.vectors",
                  "kope_mcp.memory.bulk", "kope_mcp.memory.journal", "kope_mcp.memory.read_index")
FRONT_DOOR = {"memory/experience_memory.py", "memory/transfer.py", "memory/embedding_backlog.py",
              "memory/store.py", "memory/bulk.py", "memory/journal.py", "memory/embedder.py", "memory/vectors.py",
              "memory/read_index.py", "memory/empty.py"}


def test_only_the_memorys_front_door_touches_its_store_embedder_and_vectors():
    reaching = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = "/".join(path.relative_to(PACKAGE).parts)
        if where in FRONT_DOOR or rank(path.relative_to(PACKAGE).parts) == 5:
            continue  # entry points may open a store (tools/ scripts, the CLI's recovery paths)
        text = path.read_text(encoding="utf-8")
        reaching += [f"{where} imports {module}" for module in imported(path) if module in MEMORY_INSIDES]
        reaching += [f"{where} uses memory.{part}" for part in ("store", "embedder", "vectors", "index")
                     if f"memory.{part}." in text]
    assert reaching == []


def outside_imports(package: Path, folder: str) -> list[str]:
    """Imports of kope_mcp modules outside ``folder`` by the modules in it."""
    found = []
    for path in sorted((package / folder).rglob("*.py")):
        where = "/".join(path.relative_to(package).parts)
        found += [f"{where} imports {module}" for module in imported(path, with_names=True)
                  if module.split(".")[0] == package.name and module.split(".")[1:2] != [folder]]
    return found


def test_the_runtime_imports_nothing_of_kope_mcp_outside_itself():
    # The harness runs inside the sandbox with ``python -S`` beside untrusted code: what it imports is what a
    # kernel's process holds, so it stays the standard library, numpy and runtime/ itself.
    assert outside_imports(PACKAGE, "runtime") == []


def test_the_runtime_check_catches_an_import_of_the_models(tmp_path):
    package = tmp_path / "kope_mcp"
    (package / "runtime").mkdir(parents=True)
    (package / "runtime" / "harness.py").write_text("from kope_mcp.runtime import sandbox\nimport numpy\n")
    (package / "runtime" / "sandbox.py").write_text("def f():\n    from kope_mcp import models\n")
    assert outside_imports(package, "runtime") == ["runtime/sandbox.py imports kope_mcp",
                                                   "runtime/sandbox.py imports kope_mcp.models"]


def test_context_selection_reaches_neither_the_devices_nor_the_workflow():
    # Selection ranks what the memory holds: a target's compiler or a service's workflow is none of its business.
    assert [i for i in outside_imports(PACKAGE, "experience")
            if i.split(" imports ")[1].startswith(("kope_mcp.targets", "kope_mcp.services", "kope_mcp.tools"))] == []
