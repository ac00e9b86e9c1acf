"""The read index beside the graph: trusted only when closed cleanly after the database's last write, ordered as
the read path reads, and counting stems as the full-text index does."""

from __future__ import annotations

from pathlib import Path

import pytest

from kope_mcp.hardware import hardware_rank
from kope_mcp.memory.read_index import ReadIndex, database_stamp
from kope_mcp.memory.records import AttemptRecord, LessonRecord

HERE = "x86_64/Intel Xeon/2c/avx2"
GPU = "cuda/NVIDIA H100/sm_90"


def attempt(kernel_id: str, *, task: str = "dot", family: str = "reduction", session: str = "s-1",
            created: str = "2026-01-01T00:00:00", downstream: float = 0.0, label: str = "effective",
            parent: str | None = None, signature: str | None = None, strategy_id: str | None = None,
            suspect: bool = False) -> AttemptRecord:
    return AttemptRecord(kernel_id=kernel_id, session_id=session, task_id=task, family=family, target="c",
                         hardware_key=HERE, source="int f;", source_hash="h", build_hash="b", flags=[], ok=True,
                         created_at=created, downstream=downstream, label=label, parent_id=parent,
                         error_signature=signature, strategy_id=strategy_id, suspect=suspect)


def lesson(lesson_id: str, *, task: str | None = "dot", family: str | None = "reduction", hardware: str | None = HERE,
           speedup: float | None = None, label: str = "lesson", attempt_id: str | None = None) -> LessonRecord:
    return LessonRecord(lesson_id=lesson_id, text=f"text of {lesson_id}", strategy="", task_id=task, family=family,
                        hardware_key=hardware, speedup=speedup, label=label, confidence=0.9 if speedup else 0.3,
                        verified=speedup is not None, attempt_id=attempt_id, created_at="2026-01-01T00:00:00")


def test_an_index_is_trusted_only_after_a_clean_close_for_the_same_database_file(tmp_path: Path):
    database = tmp_path / "memory.kuzu"
    database.write_bytes(b"graph")
    index = ReadIndex.beside(database)
    assert not index.attach(database_stamp(database), database_empty=False)  # never closed: not trusted
    index.add_lessons([(lesson("x-1"), "unrolled loops")])
    index.close(database_stamp(database))  # incomplete: closing does not make it trusted
    index = ReadIndex.beside(database)
    assert not index.attach(database_stamp(database), database_empty=False)
    assert index.lessons(["x-1"]) == []  # emptied
    index = ReadIndex.beside(database)
    assert index.attach(database_stamp(database), database_empty=True)  # an empty database: nothing to miss
    index.add_lessons([(lesson("x-1"), "unrolled loops")])
    index.close(database_stamp(database))
    reopened = ReadIndex.beside(database)
    assert reopened.attach(database_stamp(database), database_empty=False)
    assert [x.lesson_id for x in reopened.lessons(["x-1"])] == ["x-1"]
    reopened.close(database_stamp(database))
    # A process that only read it and died leaves it trusted (a crash costs the next server no rebuild)...
    reader = ReadIndex.beside(database)
    assert reader.attach(database_stamp(database), database_empty=False)
    assert [x.lesson_id for x in reader.lessons(["x-1"])] == ["x-1"]
    assert ReadIndex.beside(database).attach(database_stamp(database), database_empty=False)
    # ...one that wrote to it and died makes it stale.
    writer = ReadIndex.beside(database)
    assert writer.attach(database_stamp(database), database_empty=False)
    writer.add_lessons([(lesson("x-2"), "tiled loops")])
    assert not ReadIndex.beside(database).attach(database_stamp(database), database_empty=False)


@pytest.mark.parametrize("afterwards", ["written or replaced", "a write only in its log"])
def test_a_database_changed_after_the_close_makes_the_index_stale(tmp_path: Path, afterwards: str):
    database = tmp_path / "memory.kuzu"
    database.write_bytes(b"graph")
    index = ReadIndex.beside(database)
    index.attach(database_stamp(database), database_empty=True)
    index.close(database_stamp(database))
    if afterwards == "written or replaced":
        database.write_bytes(b"graph written by someone else")
    else:  # a server killed after a write the graph logged and the index never saw: the file is unchanged
        database.with_name("memory.kuzu.wal").write_bytes(b"a logged write")
    assert not ReadIndex.beside(database).attach(database_stamp(database), database_empty=False)


def test_attempt_filters_return_the_best_first_by_downstream_then_time():
    index = ReadIndex(None)
    index.attach("", database_empty=True)
    index.add_attempts([attempt("k-a", downstream=0.5, created="2026-01-01T00:00:01").__dict__,
                        attempt("k-b", downstream=2.0, created="2026-01-01T00:00:02", parent="k-a").__dict__,
                        attempt("k-c", downstream=0.5, created="2026-01-01T00:00:03", parent="k-a",
                                signature="e1").__dict__,
                        attempt("k-d", task="sum_reduce", downstream=9.0, created="2026-01-01T00:00:04",
                                suspect=True, signature="e1", strategy_id="st-1").__dict__])
    assert index.top_for_task("dot", 10) == ["k-b", "k-c", "k-a"]
    assert index.top_for_task("dot", 1) == ["k-b"]
    assert index.top_for_family("reduction", "dot", 10) == ["k-d"]
    assert index.top_for_family("reduction", None, 2) == ["k-d", "k-b"]
    assert index.with_signature("e1", 10) == ["k-d", "k-c"]
    assert index.top_for_strategy("st-1", 10) == ["k-d"]
    assert index.best(10) == ["k-b", "k-c", "k-a"]  # a suspect measurement is never among the best
    assert index.children("k-a") == ["k-b", "k-c"]
    assert index.next_in_session("k-a") == "k-b" and index.next_in_session("k-d") is None
    assert index.latest_in_session("s-1") == "k-d"
    index.update_attempt("k-a", downstream=5.0, label="ineffective")
    assert index.top_for_task("dot", 1) == ["k-a"] and "k-a" not in index.best(10)
    got = index.get(["k-c", "k-missing", "k-a"])
    assert [a.kernel_id for a in got] == ["k-c", "k-a"] and got[1].downstream == 5.0 and got[1].source == ""


def test_a_rebuild_keeps_what_a_write_put_there_meanwhile():
    index = ReadIndex(None)
    index.attach("", database_empty=False)
    assert not index.complete
    index.upsert_attempt(attempt("k-a", downstream=3.0))  # written during the rebuild: newer than the graph's copy
    index.add_lessons([(lesson("x-1"), "tiling helps")])
    index.rebuild([attempt("k-a", downstream=0.0).__dict__, attempt("k-b").__dict__],
                  [[(lesson("x-1"), "tiling helps"), (lesson("x-2"), "tiling again")]])
    assert index.complete
    assert index.get(["k-a"])[0].downstream == 3.0 and index.get(["k-b"])
    assert index.document_frequency(["tile", "help", "again"]) == {"tile": 2, "help": 1}  # "again": a stop word


def test_lessons_in_scope_take_this_machine_first_then_its_architecture_then_the_rest_by_evidence():
    index = ReadIndex(None)
    index.attach("", database_empty=True)
    other_cpu = "x86_64/AMD EPYC/64c/avx512f"
    index.add_lessons([(lesson("x-gpu", hardware=GPU, speedup=50.0, label="effective"), ""),
                       (lesson("x-other", hardware=other_cpu, speedup=20.0, label="effective"), ""),
                       (lesson("x-here-weak", hardware=HERE), ""),
                       (lesson("x-here", hardware=HERE, speedup=3.0, label="effective"), ""),
                       (lesson("x-general", task=None, family=None, hardware=None), "")])
    picked = [x.lesson_id for x in index.lessons_in_scope("dot", "reduction", HERE, 4)]
    assert picked[:2] == ["x-here", "x-here-weak"] and "x-gpu" not in picked and "x-general" in picked
    assert index.lessons_in_scope("dot", "reduction", GPU, 2)[0].lesson_id == "x-gpu"
    assert hardware_rank(HERE, HERE) == 3 and hardware_rank(other_cpu, HERE) == 2 and hardware_rank(GPU, HERE) == 0


def test_a_lesson_written_twice_counts_its_words_once():
    index = ReadIndex(None)
    index.attach("", database_empty=True)
    index.add_lessons([(lesson("x-1"), "Vectorised loops, vectorised again")])
    index.add_lessons([(lesson("x-1"), "Vectorised loops, vectorised again"), (lesson("x-2"), "loop")])
    # "again" is a stop word: in no posting list, as Kùzu's index left it out
    assert index.document_frequency(["vectoris", "loop", "again", "absent"]) == {"vectoris": 1, "loop": 2}
    assert [hit[0] for hit in index.full_text("vectorising", 5)] == ["x-1"]  # found once, not twice


def test_lessons_are_found_by_their_stemmed_words_the_best_match_first_and_ties_in_id_order():
    index = ReadIndex(None)
    index.attach("", database_empty=True)
    texts = ["unrolled loop", "unrolled registers spilled", "looping over tiled rows and columns", "unrolled loop",
             "OpenMP rows", "vector widths", "prefetch lines", "aligned stores", "fused multiply add"]
    index.add_lessons([(lesson(f"x-{n}"), text) for n, text in enumerate(texts, start=1)][::-1])
    hits = index.full_text("should I unroll this loop?", 10)
    # both words first (equal texts, equal scores: in id order), then one word in a shorter text before a longer
    assert [h[0] for h in hits] == ["x-1", "x-4", "x-2", "x-3"]
    assert hits[0][1] == hits[1][1] > hits[2][1] > hits[3][1] > 0
    assert index.full_text("the loop", 2) == index.full_text("loop", 2)  # stop words change nothing
    assert index.full_text("was the of", 5) == []  # only stop words: nothing to search for


def test_a_question_in_the_search_syntax_is_read_as_plain_words():
    index = ReadIndex(None)
    index.attach("", database_empty=True)
    index.add_lessons([(lesson("x-1"), "near misses: OR-ing masks, AND NOT branches"), (lesson("x-2"), "vectors")])
    for question in ('NEAR(or and)', 'masks OR "*"', "'; DROP TABLE lesson; --", 'col:masks', "mask* ^branch -",
                     '"unterminated', "(((", "ü — “curly”"):
        hits = index.full_text(question, 5)  # never a syntax error
        assert [h[0] for h in hits] in ([], ["x-1"]), question
    assert [h[0] for h in index.full_text("masks OR branches", 5)] == ["x-1"]


def test_an_index_written_in_another_format_is_rebuilt_not_trusted(tmp_path: Path):
    database = tmp_path / "memory.kuzu"
    database.write_bytes(b"graph")
    index = ReadIndex.beside(database)
    index.attach(database_stamp(database), database_empty=True)
    index.add_lessons([(lesson("x-1"), "unrolled loops")])
    index.close(database_stamp(database))
    import sqlite3

    with sqlite3.connect(index.path) as conn:  # as an index of the format before lesson search was written
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'format'")
    reopened = ReadIndex.beside(database)
    assert not reopened.attach(database_stamp(database), database_empty=False)
    assert reopened.full_text("unrolled", 5) == [] and reopened.lessons(["x-1"]) == []


def test_an_emptied_scratch_index_forgets_the_words_of_its_lessons_too():
    index = ReadIndex(None)
    index.attach("", database_empty=True)
    index.add_lessons([(lesson("x-1"), "unrolled loops")])
    index._clear()
    index.add_lessons([(lesson("x-2"), "unrolled twice")])
    assert [h[0] for h in index.full_text("unrolled", 5)] == ["x-2"]


def test_lesson_search_finds_what_kuzus_full_text_index_found(tmp_path: Path):
    # Lessons moved from Kùzu's FTS index to the read index's FTS5 table: the same words, stems and stop words,
    # the same BM25 (k1 1.2, b 0.75); only the idf differs for words in most documents.
    import random

    from kope_mcp.memory.store import KuzuExperienceStore

    rng = random.Random(1)
    vocab = [*sorted({"".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(3))
                      for _ in range(300)}), "the", "loops", "looping", "about"]
    lessons = [lesson(f"x-{i:04d}") for i in range(2000)]
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 30))) for _ in lessons]
    index = ReadIndex(None)
    index.attach("", database_empty=True)
    index.add_lessons(list(zip(lessons, texts, strict=True)))
    store = KuzuExperienceStore(tmp_path / "memory.kuzu")
    store.bulk_lessons(list(zip(lessons, texts, strict=True)))
    store._exec("CALL CREATE_FTS_INDEX('Lesson', 'kuzu_fts', ['search_text'])")
    agree = []
    for question in (f"{vocab[1]} {vocab[2]}", vocab[7], f"{vocab[100]} {vocab[200]} {vocab[5]}", vocab[-2],
                     "the loop", f"about {vocab[9]} loops", "about"):
        kuzu = [r["id"] for r in store._rows(
            "CALL QUERY_FTS_INDEX('Lesson', 'kuzu_fts', $q) RETURN node.lesson_id AS id, score "
            "ORDER BY score DESC, id LIMIT 10", {"q": question})]
        ours = [h[0] for h in index.full_text(question, 10)]
        assert ours[:1] == kuzu[:1], question
        agree.append(len(set(ours) & set(kuzu)) / max(1, len(kuzu)) if kuzu else float(not ours))
    store.close()
    assert min(agree) >= 0.8, agree


def test_warming_reads_the_whole_file_and_its_write_ahead_log_and_changes_nothing(tmp_path: Path, monkeypatch):
    database = tmp_path / "memory.kuzu"
    database.write_bytes(b"graph")
    index = ReadIndex.beside(database)
    assert index.attach(database_stamp(database), database_empty=True)
    index.add_lessons([(lesson(f"x-{n}"), f"unrolled loops {n} " * 20) for n in range(2000)])
    assert index.path is not None
    files = [index.path, index.path.with_name(index.path.name + "-wal")]
    sizes = {path: path.stat().st_size for path in files}
    assert all(sizes.values())
    read: dict[Path, int] = {path: 0 for path in files}
    real_open = Path.open

    def counting_open(self: Path, *args, **kwargs):
        handle = real_open(self, *args, **kwargs)
        if self in read:
            real_readinto = handle.readinto

            def readinto(buffer):
                n = real_readinto(buffer)
                read[self] += n or 0
                return n

            handle.readinto = readinto
        return handle

    monkeypatch.setattr(Path, "open", counting_open)
    index.warm()
    assert read == sizes
    assert [x.lesson_id for x in index.lessons(["x-7"])] == ["x-7"]
    ReadIndex(None).warm()  # a scratch index has no file: nothing to read
