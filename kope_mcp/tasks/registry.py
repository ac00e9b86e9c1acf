"""The task catalogue: the packaged suite plus the user's folders (``KOPE_TASKS_PATH``)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from kope_mcp.errors import InvalidTaskError, UnknownFamilyError, UnknownTaskError
from kope_mcp.tasks.loader import TASK_FILE, Task, load_task
from kope_mcp.tasks.spec import Family

log = logging.getLogger(__name__)

SUITE_DIR = Path(__file__).parent / "suite"
USER_TASKS_DIR = "tasks"
FAMILIES: tuple[str, ...] = Family.__args__  # type: ignore[attr-defined]


class TaskRegistry:
    """Loads every task folder; an invalid folder is reported and skipped, never fatal.

    With ``watch`` (a running server's registry), the user's roots (everything but the packaged suite) are
    re-read when they change: a task added with `kope tasks add`, dropped into KOPE_HOME/tasks or into a
    KOPE_TASKS_PATH folder, edited or removed, is served from the next call on, without a restart. The check is
    a few stats (each root, each task folder and its task.yaml), at most once per ``watch`` seconds; a reload
    builds the new catalogue aside and swaps it in whole, so a concurrent call sees the old or the new one.
    """

    def __init__(self, roots: list[Path], watch: float | None = None, optional: tuple[Path, ...] = ()) -> None:
        self.roots = roots
        self.watch = watch
        self._optional = optional  # roots that may not exist yet (KOPE_HOME/tasks before the first `tasks add`)
        self._user_roots = [r for r in roots if r != SUITE_DIR]
        self._stamp = self._fingerprint() if watch is not None else ()
        self._checked = time.monotonic()
        self._tasks, self.problems = self._load(roots)

    @classmethod
    def default(cls, home: Path | None = None, watch: float | None = None) -> TaskRegistry:
        """The packaged suite, the tasks added with `kope tasks add` (under KOPE_HOME/tasks), KOPE_TASKS_PATH."""
        added = [home / USER_TASKS_DIR] if home is not None else []
        extra = [Path(p).expanduser() for p in os.environ.get("KOPE_TASKS_PATH", "").split(os.pathsep) if p]
        return cls([SUITE_DIR, *added, *extra], watch=watch, optional=tuple(added))

    def _load(self, roots: list[Path]) -> tuple[dict[str, Task], list[str]]:
        tasks: dict[str, Task] = {}
        problems: list[str] = []
        for root in roots:
            if not root.is_dir():
                if root not in self._optional:
                    problems.append(f"{root}: not a folder")
                continue
            folders = [root] if (root / TASK_FILE).is_file() else sorted(_children(root))
            for folder in folders:
                if not (folder / TASK_FILE).is_file():
                    continue
                try:
                    # Only the package's own suite is imported here; any other folder's reference.py is run in
                    # the sandbox (a task folder from elsewhere is someone else's code).
                    task = load_task(folder, trusted=root == SUITE_DIR)
                except InvalidTaskError as exc:
                    problems.append(str(exc))
                    log.warning("skipping task folder: %s", exc)
                    continue
                if task.id in tasks:
                    first = tasks[task.id].folder
                    problems.append(f"{folder}: duplicate task id {task.id!r} (first from {first})")
                    continue
                tasks[task.id] = task
        return tasks, problems

    def _fingerprint(self) -> tuple[tuple[str, int], ...]:
        stamp: list[tuple[str, int]] = []
        for root in self._user_roots:
            for path in (root, *_children(root)):
                for probe in (path, path / TASK_FILE):
                    try:
                        stamp.append((str(probe), probe.stat().st_mtime_ns))
                    except OSError:
                        stamp.append((str(probe), -1))
        return tuple(stamp)

    def refresh(self) -> bool:
        """Re-read the user's roots if they changed since the last look; True when the catalogue was reloaded."""
        self._checked = time.monotonic()
        stamp = self._fingerprint()
        if stamp == self._stamp:
            return False
        before = set(self._tasks)
        self._tasks, self.problems = self._load(self.roots)
        self._stamp = stamp
        log.info("task folders changed: %d tasks now (added: %s; removed: %s)", len(self._tasks),
                 ", ".join(sorted(set(self._tasks) - before)) or "none",
                 ", ".join(sorted(before - set(self._tasks))) or "none")
        return True

    def _fresh(self) -> dict[str, Task]:
        if self.watch is not None and time.monotonic() - self._checked >= self.watch:
            self.refresh()
        return self._tasks

    def get(self, task_id: str) -> Task:
        try:
            return self._fresh()[task_id]
        except KeyError:
            raise UnknownTaskError(task_id, self._tasks) from None

    def list(self, family: str | None = None, level: int | None = None) -> list[Task]:
        if family is not None and family not in FAMILIES:
            raise UnknownFamilyError(family, FAMILIES)
        tasks = sorted(self._fresh().values(), key=lambda t: (t.spec.family, t.spec.level, t.id))
        return [
            t for t in tasks if (family is None or t.spec.family == family) and (level is None or t.spec.level == level)
        ]

    def __len__(self) -> int:
        return len(self._tasks)


def _children(root: Path) -> Iterator[Path]:
    try:
        # Hidden folders are copies being installed (task_admin.install_folder), never tasks.
        yield from (p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return
