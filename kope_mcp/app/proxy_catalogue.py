"""The stdio proxy's copy of the catalogue (list_tasks, get_task) as the home's daemon last answered it, so that a
client's first call after the daemon went idle is answered while a new daemon starts (it takes 1.3-1.6 s here)
instead of after it.

An answer is kept only for the exact circumstances it was given in, all in its key: this package's code (its
tools, models and task loader), every task folder the daemon reads (the packaged suite, ``KOPE_HOME/tasks``,
``KOPE_TASKS_PATH``: any file's size or time changed is another key), the KOPE_* settings, and what the backends'
availability depends on (the interpreter, its site-packages, PATH and the folders on it, this boot). Anything
else changes nothing in a catalogue answer: it never reads the memory. A cached answer is used only while no
daemon accepts connections; every answer the daemon gives replaces it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

import mcp.types as types

import kope_mcp

CATALOGUE_TOOLS = frozenset({"list_tasks", "get_task"})
_FOLDER = "catalogue"
KEPT = 256  # answers: every task's get_task and a few list_tasks filters


def _tree(digest: Any, root: Path) -> None:
    if not root.exists():
        digest.update(f"{root} absent\n".encode())
        return
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder) / name
            with contextlib.suppress(OSError):
                stat = path.stat()
                digest.update(f"{path} {stat.st_size} {stat.st_mtime_ns}\n".encode())


def _stat(digest: Any, path: Path) -> None:
    try:
        digest.update(f"{path} {path.stat().st_mtime_ns}\n".encode())
    except OSError:
        digest.update(f"{path} absent\n".encode())


def circumstances(home: Path) -> str:
    """The key of everything a catalogue answer depends on (a few ms: the task folders are small)."""
    from kope_mcp.tasks.registry import SUITE_DIR, USER_TASKS_DIR

    digest = hashlib.sha256(kope_mcp.__version__.encode())
    package = Path(kope_mcp.__file__).parent
    for sub in ("tools", "tasks", "targets"):
        for path in sorted((package / sub).glob("*.py")):
            _stat(digest, path)
    for name in ("models.py", "settings.py", "runtime/sandbox.py", "runtime/sandbox_setup.py"):
        _stat(digest, package / name)
    extra = [Path(p).expanduser() for p in os.environ.get("KOPE_TASKS_PATH", "").split(os.pathsep) if p]
    for root in (SUITE_DIR, home / USER_TASKS_DIR, *extra):
        _tree(digest, root)
    digest.update(json.dumps(sorted((k, v) for k, v in os.environ.items() if k.startswith("KOPE_"))).encode())
    digest.update(f"{sys.executable} {os.getuid()} {os.environ.get('PATH', '')}\n".encode())
    for folder in sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                          *os.environ.get("PATH", "").split(os.pathsep)}):
        if folder:
            _stat(digest, Path(folder))
    with contextlib.suppress(OSError):
        digest.update(Path("/proc/sys/kernel/random/boot_id").read_bytes())
    return digest.hexdigest()[:24]


def _entry(home: Path, key: str, tool: str, arguments: dict[str, Any]) -> Path:
    asked = json.dumps({k: v for k, v in sorted(arguments.items()) if v is not None}, sort_keys=True)
    name = hashlib.sha256(f"{key} {tool} {asked}".encode()).hexdigest()[:32]
    return home / "daemon" / _FOLDER / f"{name}.json"


def cached(home: Path, tool: str, arguments: dict[str, Any]) -> types.CallToolResult | None:
    if tool not in CATALOGUE_TOOLS:
        return None
    try:
        text = _entry(home, circumstances(home), tool, arguments).read_text(encoding="utf-8")
        return types.CallToolResult.model_validate_json(text)
    except (OSError, ValueError):
        return None


def keep(home: Path, tool: str, arguments: dict[str, Any], result: types.CallToolResult) -> None:
    """Keep the daemon's answer (errors are not kept: they may be about a passing state)."""
    if tool not in CATALOGUE_TOOLS or result.is_error:
        return
    path = _entry(home, circumstances(home), tool, arguments)
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(result.model_dump_json(by_alias=True, exclude_none=True), encoding="utf-8")
        os.replace(tmp, path)
        # Answers for circumstances gone by (older code, edited tasks) are never asked for again: keep the newest.
        entries = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-KEPT]:
            old.unlink(missing_ok=True)
