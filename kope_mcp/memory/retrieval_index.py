"""In-memory secondary indexes over attempt and lesson metadata for the read path.

Kùzu 0.11 has no secondary indexes: a filter on a property (task, error signature, label) scans the table,
about 4 ms per 10k rows here, so a query that needs five such filters would cost ~200 ms at 100k attempts.
This index answers them from dictionaries and also keeps every attempt's summary (all fields but the source) as
a plain tuple (~1 KB each; fetching 60 rows of 30 columns from Kùzu by key took ~7 ms here). It is rebuilt
from the store at start-up (in the background) and updated by every write that ExperienceMemory makes; until
it is loaded, the read path falls back to the store's scans.
"""

from __future__ import annotations

import bisect
import heapq
import threading
from collections.abc import Callable, Iterable
from typing import Any

from kope_mcp.memory.outcome import lesson_evidence
from kope_mcp.memory.records import AttemptRecord, LessonRecord

SUMMARY_FIELDS: tuple[str, ...] = tuple(f for f in AttemptRecord.model_fields if f != "source")
_POS = {name: i for i, name in enumerate(SUMMARY_FIELDS)}
_KERNEL, _SESSION, _TASK, _FAMILY = _POS["kernel_id"], _POS["session_id"], _POS["task_id"], _POS["family"]
_SIGNATURE, _LABEL, _DOWNSTREAM, _CREATED = _POS["error_signature"], _POS["label"], _POS["downstream"], \
    _POS["created_at"]
_PARENT, _STRATEGY, _SUSPECT, _NOISY = _POS["parent_id"], _POS["strategy_id"], _POS["suspect"], _POS["noisy"]


def summary_row(record: AttemptRecord | dict[str, Any]) -> tuple[Any, ...]:
    data = record if isinstance(record, dict) else record.__dict__
    return tuple(data.get(f) for f in SUMMARY_FIELDS)


class _Ranked:
    """Ids kept sorted by a key (descending), so the top n is a slice: no per-query heap over thousands."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: list[tuple[Any, str]] = []  # (sort key, id), ascending; the best are at the end

    def add(self, key: Any, item_id: str) -> None:
        bisect.insort(self._items, (key, item_id))

    def remove(self, key: Any, item_id: str) -> None:
        pos = bisect.bisect_left(self._items, (key, item_id))
        if pos < len(self._items) and self._items[pos] == (key, item_id):
            del self._items[pos]

    def top_entries(self, n: int) -> list[tuple[Any, str]]:
        """The best ``n`` (key, id) pairs, best first."""
        return self._items[: -n - 1 : -1] if n > 0 else []

    def top(self, n: int, skip: Callable[[str], bool] | None = None) -> list[str]:
        out: list[str] = []
        for _, item_id in reversed(self._items):
            if len(out) >= n:
                break
            if skip is None or not skip(item_id):
                out.append(item_id)
        return out


class RetrievalIndex:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded = threading.Event()
        self._attempts: dict[str, tuple[Any, ...]] = {}
        self._by_task: dict[str, _Ranked] = {}
        self._by_family: dict[str, _Ranked] = {}
        self._by_signature: dict[str, _Ranked] = {}
        self._by_strategy: dict[str, _Ranked] = {}
        self._effective = _Ranked()
        self._by_session: dict[str, list[str]] = {}
        self._children: dict[str, list[str]] = {}
        self._lessons: dict[str, LessonRecord] = {}
        # Lessons per scope (a task, a family, none) and hardware key, each group sorted by evidence, so a query
        # ranks a few groups instead of scoring thousands of lessons (50k lessons: ~29 ms -> <1 ms).
        self._lessons_by_task: dict[str, dict[str | None, _Ranked]] = {}
        self._lessons_by_family: dict[str, dict[str | None, _Ranked]] = {}
        self._general_lessons: dict[str | None, _Ranked] = {}
        self._lessons_by_attempt: dict[str, list[str]] = {}

    @property
    def loaded(self) -> bool:
        return self._loaded.is_set()

    def load(self, attempts: Iterable[tuple[Any, ...]], lessons: Iterable[LessonRecord]) -> None:
        for row in attempts:
            self._upsert_row(row)
        for lesson in lessons:
            self.add_lesson(lesson)
        with self._lock:
            for ids in (*self._by_session.values(), *self._children.values()):
                ids.sort(key=lambda i: self._attempts[i][_CREATED])
        self._loaded.set()

    def upsert_attempt(self, record: AttemptRecord) -> None:
        self._upsert_row(summary_row(record))

    def _upsert_row(self, row: tuple[Any, ...]) -> None:
        kernel_id = row[_KERNEL]
        with self._lock:
            old = self._attempts.get(kernel_id)
            if old is not None:
                self._unlink(old)
            else:
                self._by_session.setdefault(row[_SESSION], []).append(kernel_id)
                if row[_PARENT]:
                    self._children.setdefault(row[_PARENT], []).append(kernel_id)
            self._attempts[kernel_id] = row
            score = (row[_DOWNSTREAM] or 0.0, row[_CREATED])
            self._by_task.setdefault(row[_TASK], _Ranked()).add(score, kernel_id)
            self._by_family.setdefault(row[_FAMILY], _Ranked()).add(score, kernel_id)
            if row[_SIGNATURE]:
                self._by_signature.setdefault(row[_SIGNATURE], _Ranked()).add(row[_CREATED], kernel_id)
            if row[_STRATEGY]:
                self._by_strategy.setdefault(row[_STRATEGY], _Ranked()).add(score, kernel_id)
            if row[_LABEL] == "effective" and not row[_SUSPECT] and not row[_NOISY]:
                self._effective.add(score, kernel_id)

    def update_attempt(self, kernel_id: str, **fields: Any) -> None:
        with self._lock:
            row = self._attempts.get(kernel_id)
        if row is None:
            return
        values = list(row)
        for name, value in fields.items():
            if name in _POS:
                values[_POS[name]] = value
        self._upsert_row(tuple(values))

    def _unlink(self, row: tuple[Any, ...]) -> None:
        kernel_id = row[_KERNEL]
        score = (row[_DOWNSTREAM] or 0.0, row[_CREATED])
        self._by_task[row[_TASK]].remove(score, kernel_id)
        self._by_family[row[_FAMILY]].remove(score, kernel_id)
        if row[_SIGNATURE]:
            self._by_signature[row[_SIGNATURE]].remove(row[_CREATED], kernel_id)
        if row[_STRATEGY]:
            self._by_strategy[row[_STRATEGY]].remove(score, kernel_id)
        self._effective.remove(score, kernel_id)

    def get(self, kernel_ids: Iterable[str]) -> list[AttemptRecord]:
        """Summaries (no source) of the ids that exist, in the order given."""
        with self._lock:
            rows = [self._attempts.get(i) for i in kernel_ids]
        # Built without validation: the rows were validated when they were written or loaded.
        return [AttemptRecord.model_construct(**dict(zip(SUMMARY_FIELDS, r, strict=True)), source="")
                for r in rows if r is not None]

    def add_lesson(self, lesson: LessonRecord) -> None:
        with self._lock:
            if lesson.lesson_id in self._lessons:
                return  # lessons are never edited: the same id is the same lesson
            self._lessons[lesson.lesson_id] = lesson
            if lesson.attempt_id:
                self._lessons_by_attempt.setdefault(lesson.attempt_id, []).append(lesson.lesson_id)
            key = (lesson_evidence(lesson.label, lesson.speedup, lesson.confidence), lesson.lesson_id)
            groups = []
            if lesson.task_id:
                groups.append(self._lessons_by_task.setdefault(lesson.task_id, {}))
            if lesson.family:
                groups.append(self._lessons_by_family.setdefault(lesson.family, {}))
            if not lesson.task_id and not lesson.family:
                groups.append(self._general_lessons)
            for by_hardware in groups:
                by_hardware.setdefault(lesson.hardware_key, _Ranked()).add(key, lesson.lesson_id)

    # --- the read path ---------------------------------------------------------------------------------
    def top_for_task(self, task_id: str, n: int) -> list[str]:
        with self._lock:
            group = self._by_task.get(task_id)
            return group.top(n) if group else []

    def top_for_family(self, family: str, exclude_task: str | None, n: int) -> list[str]:
        with self._lock:
            group = self._by_family.get(family)
            return group.top(n, skip=lambda i: self._attempts[i][_TASK] == exclude_task) if group else []

    def with_signature(self, signature: str, n: int) -> list[str]:
        with self._lock:
            group = self._by_signature.get(signature)
            return group.top(n) if group else []

    def top_for_strategy(self, strategy_id: str, n: int) -> list[str]:
        with self._lock:
            group = self._by_strategy.get(strategy_id)
            return group.top(n) if group else []

    def best(self, n: int) -> list[str]:
        with self._lock:
            return self._effective.top(n)

    def children(self, kernel_id: str) -> list[str]:
        """PREV successors, oldest first."""
        with self._lock:
            return list(self._children.get(kernel_id, ()))

    def next_in_session(self, kernel_id: str) -> str | None:
        with self._lock:
            row = self._attempts.get(kernel_id)
            if row is None:
                return None
            ids = self._by_session.get(row[_SESSION], [])
            position = ids.index(kernel_id)
            return ids[position + 1] if position + 1 < len(ids) else None

    def latest_in_session(self, session_id: str) -> str | None:
        with self._lock:
            ids = self._by_session.get(session_id)
            return ids[-1] if ids else None

    def lessons_in_scope(self, task_id: str | None, family: str | None, hardware: str | None,
                         n: int) -> list[LessonRecord]:
        """Up to ``n`` lessons about this task, its family and none in particular (half, half and a quarter of
        ``n``), each group by what they report for this hardware: the strongest measured evidence on the same
        machine first, then the same architecture, then the rest; never by age (``hardware_rank``)."""
        with self._lock:
            picked: dict[str, LessonRecord] = {}
            for by_hardware, share in ((self._lessons_by_task.get(task_id or "", {}), n // 2),
                                       (self._lessons_by_family.get(family or "", {}), n // 2),
                                       (self._general_lessons, max(1, n // 4))):
                taken = 0
                ranks = sorted({hardware_rank(key, hardware) for key in by_hardware}, reverse=True)
                for rank in ranks:
                    groups = [g for key, g in by_hardware.items() if hardware_rank(key, hardware) == rank]
                    best = heapq.nlargest(share - taken, (entry for g in groups for entry in g.top_entries(share)))
                    for _, lesson_id in best:
                        picked[lesson_id] = self._lessons[lesson_id]
                    taken += len(best)
                    if taken >= share:
                        break
            return list(picked.values())

    def lessons_about(self, kernel_ids: Iterable[str]) -> list[LessonRecord]:
        with self._lock:
            return [self._lessons[i] for k in kernel_ids for i in self._lessons_by_attempt.get(k, ())]

    def lessons(self, lesson_ids: Iterable[str]) -> list[LessonRecord]:
        with self._lock:
            return [self._lessons[i] for i in lesson_ids if i in self._lessons]


def hardware_rank(key: str | None, wanted: str | None) -> int:
    """3: the same machine (or knowledge for any); 2: the same architecture and kind; 1: the same kind of device
    (a CPU for a CPU); 0: another kind (a GPU result for a CPU question). Keys look like
    ``x86_64/AMD EPYC/2c/avx512f`` and ``cuda/NVIDIA H100/sm_90``."""
    if key is None or wanted is None or key == wanted:
        return 3
    mine, theirs = key.split("/", 1)[0], wanted.split("/", 1)[0]
    if mine == theirs:
        return 2
    return 1 if (mine == "cuda") == (theirs == "cuda") else 0
