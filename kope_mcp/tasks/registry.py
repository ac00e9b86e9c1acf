"""The task catalogue: the packaged suite plus the user's folders (``KOPE_TASKS_PATH``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from kope_mcp.errors import InvalidTaskError, UnknownFamilyError, UnknownTaskError
from kope_mcp.tasks.loader import TASK_FILE, Task, load_task
from kope_mcp.tasks.spec import Family

log = logging.getLogger(__name__)

SUITE_DIR = Path(__file__).parent / "suite"
USER_TASKS_DIR = "tasks"
FAMILIES: tuple[str, ...] = Family.__args__  # type: ignore[attr-defined]


class TaskRegistry:
    """Loads every task folder once; an invalid folder is reported and skipped, never fatal."""

    def __init__(self, roots: list[Path]) -> None:
        self._tasks: dict[str, Task] = {}
        self.problems: list[str] = []
        for root in roots:
            self._load_root(root)

    @classmethod
    def default(cls, home: Path | None = None) -> TaskRegistry:
        """The packaged suite, the tasks added with `kope tasks add` (under KOPE_HOME/tasks), KOPE_TASKS_PATH."""
        added = [home / USER_TASKS_DIR] if home is not None and (home / USER_TASKS_DIR).is_dir() else []
        extra = [Path(p).expanduser() for p in os.environ.get("KOPE_TASKS_PATH", "").split(os.pathsep) if p]
        return cls([SUITE_DIR, *added, *extra])

    def _load_root(self, root: Path) -> None:
        if not root.is_dir():
            self.problems.append(f"{root}: not a folder")
            return
        folders = [root] if (root / TASK_FILE).is_file() else sorted(p for p in root.iterdir() if p.is_dir())
        for folder in folders:
            if not (folder / TASK_FILE).is_file():
                continue
            try:
                task = load_task(folder)
            except InvalidTaskError as exc:
                self.problems.append(str(exc))
                log.warning("skipping task folder: %s", exc)
                continue
            if task.id in self._tasks:
                first = self._tasks[task.id].folder
                self.problems.append(f"{folder}: duplicate task id {task.id!r} (first from {first})")
                continue
            self._tasks[task.id] = task

    def get(self, task_id: str) -> Task:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise UnknownTaskError(task_id, self._tasks) from None

    def list(self, family: str | None = None, level: int | None = None) -> list[Task]:
        if family is not None and family not in FAMILIES:
            raise UnknownFamilyError(family, FAMILIES)
        tasks = sorted(self._tasks.values(), key=lambda t: (t.spec.family, t.spec.level, t.id))
        return [
            t for t in tasks if (family is None or t.spec.family == family) and (level is None or t.spec.level == level)
        ]

    def __len__(self) -> int:
        return len(self._tasks)
