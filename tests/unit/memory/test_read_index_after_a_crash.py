"""A crash costs no answers: a server that only read and was killed leaves the read index trusted; one killed
after a write leaves it stale, and the next one rebuilds it while answering from the store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kope_mcp.memory.experience_memory import ExperienceMemory
from kope_mcp.memory.records import LessonRecord

pytestmark = pytest.mark.slow  # subprocesses that open the graph

KILLED_AFTER = """
import os, signal, sys
from pathlib import Path
from kope_mcp.memory.experience_memory import ExperienceMemory
from kope_mcp.memory.records import LessonRecord
memory = ExperienceMemory.open(Path(sys.argv[1]), embeddings=False)
memory.start()
assert memory.wait_index(60)
if sys.argv[2] == "write":
    memory.add_lesson(LessonRecord(lesson_id="x-late", text="written, then killed", strategy="", task_id="dot",
                                   label="lesson", confidence=0.3, verified=False, created_at="2026-01-02T00:00:00"),
                      "written then killed")
else:
    assert [x.lesson_id for x in memory.lessons_by_id(["x-1"])] == ["x-1"]
    memory.full_text("unrolled loops", 5)
os.kill(os.getpid(), signal.SIGKILL)
"""


def lesson(lesson_id: str, text: str) -> LessonRecord:
    return LessonRecord(lesson_id=lesson_id, text=text, strategy="", task_id="dot", label="lesson", confidence=0.3,
                        verified=False, created_at="2026-01-01T00:00:00")


def killed_after(path: Path, what: str) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_AFTER, str(path), what], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == -9, done.stderr


def reopened(path: Path) -> ExperienceMemory:
    return ExperienceMemory.open(path, embeddings=False)


def a_memory_with_one_lesson(tmp_path: Path) -> Path:
    path = tmp_path / "memory.kuzu"
    memory = reopened(path)
    memory.add_lesson(lesson("x-1", "unrolled loops"), "unrolled loops")
    memory.stop()
    memory.close()
    return path


def test_a_server_killed_after_reading_costs_the_next_one_no_rebuild(tmp_path: Path):
    path = a_memory_with_one_lesson(tmp_path)
    killed_after(path, "read")
    memory = reopened(path)
    try:
        assert memory.index.complete  # trusted at once: nothing to rebuild, lessons searchable from the start
        assert any(hit[1] == "x-1" for hit in memory.full_text("unrolled loops", 5))
    finally:
        memory.stop()
        memory.close()


def test_a_server_killed_after_a_write_leaves_an_index_the_next_one_rebuilds_while_answering(tmp_path: Path):
    path = a_memory_with_one_lesson(tmp_path)
    killed_after(path, "write")
    memory = reopened(path)
    try:
        assert not memory.index.complete  # the killed server's write reached the graph, maybe not the index
        assert {x.lesson_id for x in memory.lessons_by_id(["x-1", "x-late"])} == {"x-1", "x-late"}  # the store
        # Lessons are still searched meanwhile: by a scan of the graph, the best match first.
        assert [h[1] for h in memory.full_text("unrolled loops killed", 5) if h[0] == "lesson"][:2] == ["x-1", "x-late"]
        memory.start()
        assert memory.wait_index(60)
        assert {x.lesson_id for x in memory.lessons_by_id(["x-1", "x-late"])} == {"x-1", "x-late"}
    finally:
        memory.stop()
        memory.close()
