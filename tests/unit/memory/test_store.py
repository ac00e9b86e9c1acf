import pytest

from kope_mcp.memory.records import AgentInfo, AttemptRecord, SessionRecord, StrategyRecord
from kope_mcp.memory.rows import attempt_props
from kope_mcp.memory.store import KuzuExperienceStore


def make_attempt(kernel_id: str, parent: str | None = None) -> AttemptRecord:
    return AttemptRecord(kernel_id=kernel_id, session_id="s-1", task_id="relu", family="elementwise",
                         hardware_key="hw", target="c", build_hash="h", source="src", source_hash="sh", flags=["-O3"],
                         ok=True, parent_id=parent, created_at=f"2026-01-01T00:00:0{kernel_id[-1]}",
                         strategy="unroll by 4")


def populated(tmp_path) -> KuzuExperienceStore:
    store = KuzuExperienceStore(tmp_path / "memory.kuzu")
    store.upsert_task("relu", "elementwise", 1, "relu")
    store.upsert_hardware("hw", "x86_64", "cpu", 2, ["avx2"], [])
    store.add_session(SessionRecord(session_id="s-1", task_id="relu", hardware_key="hw",
                                    agent=AgentInfo(name="claude", version="1"), created_at="2026-01-01"))
    store.add_attempt(make_attempt("k-1"))
    store.add_attempt(make_attempt("k-2", parent="k-1"))
    store.add_attempt(make_attempt("k-3", parent="k-1"))
    return store


def test_migrations_are_recorded_once_and_data_survives_reopening(tmp_path):
    store = populated(tmp_path)
    assert store.schema_version() == 6
    store.close()
    again = KuzuExperienceStore(tmp_path / "memory.kuzu")
    assert again.schema_version() == 6
    assert again.counts()["Attempt"] == 3
    assert again.session("s-1").agent.name == "claude"


def test_prev_edges_form_a_forest_with_many_successors(tmp_path):
    store = populated(tmp_path)
    assert {a.kernel_id for a in store.successors("k-1")} == {"k-2", "k-3"}
    assert store.counts()["PREV"] == 2
    assert store.latest_in_session("s-1").kernel_id == "k-3"


def test_updates_and_full_text_search(tmp_path):
    store = populated(tmp_path)
    store.update_attempt("k-2", speedup=2.5, label="effective", flags=["-O2"])
    found = store.attempt("k-2")
    assert found.speedup == 2.5 and found.label == "effective" and found.flags == ["-O2"]
    store.add_strategy(StrategyRecord(strategy_id="st-1", name="unroll by 4", key="4 unroll"))
    store.add_strategy(StrategyRecord(strategy_id="st-2", name="OpenMP over rows", key="openmp parallel row"))
    hits = store.full_text("unroll the loop", 10)
    assert [(kind, item_id) for kind, item_id, _ in hits] == [("strategy", "st-1")]


def test_a_pasted_pointer_type_does_not_match_every_strategy(tmp_path):
    store = populated(tmp_path)
    store.add_strategy(StrategyRecord(strategy_id="st-1", name="unroll by 4", key="4 unroll"))
    store.add_strategy(StrategyRecord(strategy_id="st-2", name="OpenMP over rows", key="openmp parallel row"))
    # The FTS parser took `*` for a term every document matches (and a query then cost ~20x at 50k lessons).
    assert store.full_text("have 'void(const float *, float *, int)'", 10) == []
    assert [h[1] for h in store.full_text("unroll *", 10)] == ["st-1"]
    assert store.full_text("*** ;;", 10) == []


def test_an_attempt_for_a_missing_session_is_refused_not_silently_dropped(tmp_path):
    import pytest

    store = populated(tmp_path)
    orphan = make_attempt("k-9").model_copy(update={"session_id": "s-missing"})
    with pytest.raises(ValueError, match="must exist first"):
        store.add_attempt(orphan)


def test_a_version_1_home_upgrades_in_place_and_keeps_its_attempts(tmp_path, monkeypatch):
    import kope_mcp.memory.store as store_module
    from kope_mcp.memory.rows import ATTEMPT_COLUMNS_V1

    monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS[:1])
    monkeypatch.setattr(store_module, "_SUMMARY_RETURN", ", ".join(
        f"a.{c} AS {c}" for c in ATTEMPT_COLUMNS_V1 if c not in ("source", "search_text")))
    old = KuzuExperienceStore(tmp_path / "memory.kuzu")
    old.upsert_task("relu", "elementwise", 1, "relu")
    old.upsert_hardware("hw", "x86_64", "cpu", 2, ["avx2"], [])
    old.add_session(SessionRecord(session_id="s-1", task_id="relu", hardware_key="hw",
                                  agent=AgentInfo(name="claude", version="1"), created_at="2026-01-01"))
    props = {k: v for k, v in attempt_props(make_attempt("k-1").model_copy(update={"label": "effective"})).items()
             if k in ATTEMPT_COLUMNS_V1} | {"backend": "c", "uses_openmp": True}
    old._exec("CREATE (a:Attempt {" + ", ".join(f"{k}: ${k}" for k in props) + "})", props)
    assert old.schema_version() == 1
    old.close()
    monkeypatch.undo()
    upgraded = KuzuExperienceStore(tmp_path / "memory.kuzu")
    assert upgraded.schema_version() == 6
    attempt = upgraded.attempt("k-1")
    assert attempt.label == "effective" and attempt.suspect is False and attempt.suspect_reason == ""
    assert attempt.origin == ""  # migration 5: measured here
    assert attempt.target == "c"  # migration 3: the column `backend` became `target`; uses_openmp went to the build
    upgraded.update_attempt("k-1", suspect=True, suspect_reason="CI contains 1")
    assert upgraded.attempt("k-1").suspect


def test_an_export_written_before_targets_still_imports_with_its_backend_as_target():
    legacy = make_attempt("k-7").model_dump() | {"backend": "c", "uses_openmp": True}
    del legacy["target"]
    assert AttemptRecord.model_validate(legacy).target == "c"


def test_bulk_lessons_keep_every_text_exactly_whatever_it_holds(tmp_path):
    # Bulk lessons go through a CSV COPY: quotes, commas, newlines, empty strings, the words NULL and the COPY's
    # own null marker must come back as written, and every lesson is found by its words.
    from kope_mcp.memory.bulk import _NULL
    from kope_mcp.memory.records import LessonRecord

    store = populated(tmp_path)
    texts = ['a "quoted", comma\nand a new line\r\n', "", "KOPE_NULL", "\\N", "ünïcode — “curly” \t tab", "'; --",
             "plain words"]
    lessons = [LessonRecord(lesson_id=f"x-{i}", text=text, strategy="unroll by 4", task_id="relu",
                            family="elementwise", verified=i % 2 == 0, label="lesson", confidence=0.25 * (i % 4),
                            speedup=None if i % 3 else 1.5 + i, agent="" if i % 2 else "claude",
                            created_at="2026-01-01T00:00:00Z", attempt_id="k-1" if i == 0 else None)
               for i, text in enumerate(texts)]
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf"]
    copied = []
    run = store._exec
    store._exec = lambda query, params=None: (copied.append(query.startswith("COPY Lesson")), run(query, params))[1]
    store.bulk_lessons([(lesson, f"{lesson.text} {words[i]}") for i, lesson in enumerate(lessons)])
    assert any(copied)  # by COPY, not by the UNWIND it falls back to
    plain = LessonRecord(lesson_id="x-plain", text=_NULL, strategy="", task_id="relu", verified=False, label="lesson",
                         confidence=0.5, created_at="2026-01-02")
    store.bulk_lessons([(plain, "hotel")])
    for i, lesson in enumerate(lessons):
        assert store.lesson(lesson.lesson_id) == lesson, i
    assert store.lesson("x-plain").text == "NULL"
    searched = {r["i"]: r["t"] for r in store._rows("MATCH (x:Lesson) RETURN x.lesson_id AS i, x.search_text AS t")}
    assert searched["x-plain"] == "hotel"
    assert all(searched[x.lesson_id].endswith(words[i]) for i, x in enumerate(lessons))
    assert [lesson.lesson_id for lesson in store.lessons_for_attempt("k-1")] == ["x-0"]


def test_nodes_are_read_a_page_at_a_time_in_the_order_they_were_written(tmp_path):
    store = populated(tmp_path)  # k-1, then k-2 and k-3 whose parent is k-1
    for i in range(4, 10):
        store.add_attempt(make_attempt(f"k-{i}", parent=f"k-{i - 1}"))
    pages = list(store.node_pages("Attempt", page=4))
    assert [len(p) for p in pages] == [4, 4, 1]
    assert [n["kernel_id"] for p in pages for n in p] == [f"k-{i}" for i in range(1, 10)]
    assert list(store.node_pages("Lesson")) == []  # an empty table: no page at all


@pytest.mark.slow  # a child process killed with its write-ahead log unflushed
@pytest.mark.parametrize("home", ["new", "upgraded from schema 5"])
def test_a_home_killed_right_after_its_migrations_opens_again(tmp_path, monkeypatch, home):
    # Migration 6 drops Kùzu's lesson index; replaying a lesson written after the drop from the write-ahead log
    # failed ("Cannot find table catalog entry"), so a server killed before its first checkpoint left a dead home.
    import subprocess
    import sys

    from kope_mcp.memory import store as store_module
    from kope_mcp.memory.records import LessonRecord

    lessons = 0
    if home != "new":
        monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS[:5])  # with Kùzu's lesson index
        old = KuzuExperienceStore(tmp_path / "memory.kuzu")
        old.add_lesson(LessonRecord(lesson_id="x-1", text="unrolled", strategy="", verified=False, label="lesson",
                                    confidence=0.3, created_at="2026-01-01"), "unrolled")
        assert old.schema_version() == 5
        old.close()
        monkeypatch.undo()
        lessons = 1
    child = subprocess.run([sys.executable, "-c", (
        "import os, sys; from pathlib import Path; from kope_mcp.memory.store import KuzuExperienceStore as S; "
        "from kope_mcp.memory.records import LessonRecord as L; s = S(Path(sys.argv[1])); "
        "s.upsert_task('exp', 'activation', 1, 'exp'); s.add_lesson(L(lesson_id='x-2', text='tiled', strategy='', "
        "verified=False, label='lesson', confidence=0.3, created_at='2026-01-02'), 'tiled'); os.kill(os.getpid(), 9)"),
        str(tmp_path / "memory.kuzu")], capture_output=True, timeout=120)
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    reopened = KuzuExperienceStore(tmp_path / "memory.kuzu")
    assert reopened.schema_version() == 6 and reopened.counts()["Lesson"] == lessons + 1
    assert reopened.counts()["Task"] == 1  # the writes after the migrations, replayed from the log
    reopened.close()
