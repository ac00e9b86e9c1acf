"""`kope memory import` writes attempts, lessons and embeddings a chunk at a time (COPYs), with every edge a
record written alone gets, and refuses a record whose session, task, hardware or parent is nowhere."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kope_mcp.memory import admin as memory_admin
from kope_mcp.memory.admin import FORMAT, VERSION, InvalidExportError, export_line, import_memory
from kope_mcp.memory.experience_memory import ExperienceMemory
from kope_mcp.memory.records import AgentInfo, AttemptRecord, LessonRecord, SessionRecord
from kope_mcp.memory.schema import EMBEDDING_DIM

HW = "x86_64/Intel Xeon/2c/avx2"


def attempt(n: int, parent: int | None, session: str = "s-1") -> AttemptRecord:
    return AttemptRecord(kernel_id=f"k-{n:05d}", session_id=session, task_id="relu", family="activation",
                         hardware_key=HW, target="c", build_hash=f"b{n}", source=f"void kernel() {{ /* {n} */ }}",
                         source_hash=f"h{n}", flags=["-O3"], ok=True, parent_id=f"k-{parent:05d}" if parent else None,
                         strategy="unroll by four" if n % 2 else None, strategy_id="st-1" if n % 2 else None,
                         created_at=f"2026-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}", tested=True, correct=True,
                         speedup=1.0 + n / 100, label="effective" if n % 3 == 0 else "unmeasured",
                         downstream=float(n % 7))


def unit(n: int) -> list[float]:
    vector = [math.sin(n + i) for i in range(EMBEDDING_DIM)]
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


def write_export(path: Path, attempts: list[AttemptRecord], extra: list[tuple[str, dict]] = ()) -> None:
    lines = [json.dumps({"kind": "header", "format": FORMAT, "version": VERSION, "home_id": "elsewhere"})]
    lines += [export_line("task", {"id": "relu", "family": "activation", "level": 1, "summary": "relu"}),
              export_line("hardware", {"key": HW, "arch": "x86_64", "cpu_model": "Intel Xeon", "cores": 2,
                                       "isa": '["avx2"]', "caches": "{}"}),
              export_line("strategy", {"strategy_id": "st-1", "name": "unroll by four", "key": "four unroll",
                                       "created_at": "2026-01-01"})]
    for session in ("s-1", "s-2"):
        lines.append(export_line("session", SessionRecord(session_id=session, task_id="relu", hardware_key=HW,
                                                          agent=AgentInfo(name="claude"),
                                                          created_at="2026-01-01").model_dump()))
    lines += [export_line("attempt", a.model_dump()) for a in attempts]
    lines += [export_line(kind, data) for kind, data in extra]
    path.write_text("\n".join(lines) + "\n")


def edges(memory: ExperienceMemory, rel: str) -> int:
    return int(memory.store._rows(f"MATCH ()-[r:{rel}]->() RETURN count(r) AS c")[0]["c"])


def chain(count: int) -> list[AttemptRecord]:
    """Parents before children, some parents several chunks back, in two sessions."""
    return [attempt(n, parent=None if n == 1 else max(1, n // 3), session="s-1" if n % 4 else "s-2")
            for n in range(1, count + 1)]


def test_attempts_imported_by_chunks_get_every_edge_and_the_answers_of_attempts_written_one_by_one(
        tmp_path, monkeypatch):
    attempts = chain(23)
    lessons = [LessonRecord(lesson_id=f"x-{n}", text=f"unrolling helped kernel {n}", strategy="unroll by four",
                            strategy_id="st-1", task_id="relu", family="activation", hardware_key=HW,
                            attempt_id=f"k-{n:05d}", verified=True, label="effective", speedup=1.5, confidence=0.9,
                            created_at="2026-01-02") for n in (3, 9, 21)]
    embeddings = [("embedding", {"id": f"k-{n:05d}", "item_kind": "attempt", "model": "all-MiniLM-L6-v2",
                                 "vector": unit(n)}) for n in range(1, 8)]
    path = tmp_path / "export.jsonl"
    write_export(path, attempts, [("lesson", x.model_dump()) for x in lessons] + embeddings)
    # The reference: attempts and embeddings written one statement each, as before chunks
    monkeypatch.setattr(memory_admin, "CHUNK_ROWS", {"lesson": 2})
    reference = ExperienceMemory.open(tmp_path / "reference.kuzu", embeddings=False)
    import_memory(reference, path)
    monkeypatch.setattr(memory_admin, "CHUNK_ROWS", {"session": 1, "lesson": 2, "attempt": 4, "embedding": 3})
    chunked = ExperienceMemory.open(tmp_path / "chunked.kuzu", embeddings=False)
    copies: list[str] = []
    run = chunked.store._exec
    chunked.store._exec = lambda q, p=None: (copies.append(q.split(" FROM")[0]), run(q, p))[1]
    report = import_memory(chunked, path)
    assert report.added == {"task": 1, "hardware": 1, "strategy": 1, "session": 2, "attempt": 23, "lesson": 3,
                            "embedding": 7}
    assert copies.count("COPY Attempt") == 6  # 23 attempts in chunks of 4, not 23 statements
    assert copies.count("COPY Session") == 2
    assert chunked.store.sessions() == reference.store.sessions()
    counts = chunked.store.counts() | {rel: edges(chunked, rel) for rel in ("IN_SESSION", "FOR_TASK", "ON_HARDWARE")}
    assert counts["IN_SESSION"] == counts["FOR_TASK"] - 2 == counts["ON_HARDWARE"] - 2 == 23  # sessions' too
    assert counts["PREV"] == 22 and counts["APPLIED"] == 12 and counts["FROM_ATTEMPT"] == 3
    assert counts["Embedding"] == 7 and len(chunked.vectors) == 7
    assert chunked.vectors.search(unit(5), 1)[0][0] == "k-00005"
    assert counts == reference.store.counts() | {rel: edges(reference, rel)
                                                 for rel in ("IN_SESSION", "FOR_TASK", "ON_HARDWARE")}
    for kernel in ("k-00009", "k-00022"):
        assert chunked.store.lineage(kernel) == reference.store.lineage(kernel)
        assert chunked.store.attempt(kernel) == reference.store.attempt(kernel)
    assert chunked.index.get(["k-00012"]) == reference.index.get(["k-00012"]) != []
    assert [a.kernel_id for a in chunked.attempts_for_task("relu", 5)] == \
        [a.kernel_id for a in reference.attempts_for_task("relu", 5)]
    again = import_memory(chunked, path)
    assert not again.added and chunked.store.counts().items() <= counts.items()
    assert edges(chunked, "IN_SESSION") == 23
    for memory in (chunked, reference):
        memory.close()


@pytest.mark.parametrize("broken", ["parent", "session", "dimension", "task of a session"])
def test_a_record_naming_what_is_nowhere_is_refused_with_its_line(
        tmp_path, monkeypatch, broken):
    monkeypatch.setattr(memory_admin, "CHUNK_ROWS", {"session": 2, "lesson": 2, "attempt": 4, "embedding": 3})
    attempts = chain(9)
    extra: list[tuple[str, dict]] = []
    if broken == "parent":
        attempts[6] = attempts[6].model_copy(update={"parent_id": "k-99999"})
    elif broken == "session":
        attempts[6] = attempts[6].model_copy(update={"session_id": "s-nowhere"})
    elif broken == "dimension":
        extra = [("embedding", {"id": "k-00001", "item_kind": "attempt", "model": "m", "vector": [0.5, 0.5]})]
    path = tmp_path / "export.jsonl"
    write_export(path, attempts, extra)
    if broken == "task of a session":
        lines = path.read_text().splitlines()
        session = {k: v for k, v in json.loads(lines[5]).items() if k not in ("kind", "sha256")}
        lines[5] = export_line("session", session | {"task_id": "no-such-task"})
        path.write_text("\n".join(lines) + "\n")
    memory = ExperienceMemory.open(tmp_path / "memory.kuzu", embeddings=False)
    with pytest.raises(InvalidExportError) as refused:
        import_memory(memory, path)
    # a header and 5 lines of structure (the sessions on lines 5 and 6), then the attempts
    line = {"parent": 13, "session": 13, "dimension": 16, "task of a session": 6}[broken]
    assert f"export.jsonl:{line}:" in str(refused.value)
    assert {"parent": "k-99999", "session": "s-nowhere", "dimension": f"{EMBEDDING_DIM} finite numbers",
            "task of a session": "no-such-task"}[broken] in str(refused.value)
    memory.close()


def test_a_chunk_ends_at_its_byte_budget_whatever_its_rows(tmp_path, monkeypatch):
    # An attempt's source can be hundreds of kilobytes: a chunk of rows alone would not bound the importer's memory
    attempts = [a.model_copy(update={"source": f"/* {n} */" + "x" * 3000}) for n, a in enumerate(chain(12))]
    path = tmp_path / "export.jsonl"
    write_export(path, attempts)
    monkeypatch.setattr(memory_admin, "CHUNK_BYTES", 10_000)  # three attempts' lines
    memory = ExperienceMemory.open(tmp_path / "memory.kuzu", embeddings=False)
    copies: list[str] = []
    run = memory.store._exec
    memory.store._exec = lambda q, p=None: (copies.append(q.split(" FROM")[0]), run(q, p))[1]
    assert import_memory(memory, path).added["attempt"] == 12
    assert copies.count("COPY Attempt") == 4 and memory.store.counts()["PREV"] == 11
    memory.close()


def test_an_import_into_a_staging_copy_writes_nodes_by_large_copies_and_edges_once_with_the_same_graph(
        tmp_path, monkeypatch):
    # What `kope memory import` does (prepare_bulk): nodes gathered into COPYs of many chunks, edges at the end;
    # a duplicate later in the file must be recognised while its first copy is still only in a pending file.
    from kope_mcp.memory import bulk

    attempts = chain(23)
    path = tmp_path / "export.jsonl"
    write_export(path, [*attempts, attempts[4]])
    monkeypatch.setattr(memory_admin, "CHUNK_ROWS", {"session": 1, "lesson": 2, "attempt": 4, "embedding": 3})
    reference = ExperienceMemory.open(tmp_path / "reference.kuzu", embeddings=False)
    import_memory(reference, path)
    monkeypatch.setattr(bulk, "DEFERRED_ROWS", 5)
    staged = ExperienceMemory.open(tmp_path / "staged.kuzu", embeddings=False)
    staged.prepare_bulk()
    copies: list[str] = []
    run = staged.store._exec
    staged.store._exec = lambda q, p=None: (copies.append(q.split(" FROM")[0]), run(q, p))[1]
    report = import_memory(staged, path)
    assert report.added["attempt"] == 23 and report.skipped_existing == {"attempt": 1}
    assert [c for c in copies if c.startswith("COPY PREV")] == []  # not yet: edges wait for every node
    staged.finish_bulk(completed=True)
    assert copies.count("COPY Attempt") == 3 and copies.count("COPY PREV") == 1
    assert not list(tmp_path.glob("staged.kuzu.pending-*"))
    rels = ("IN_SESSION", "FOR_TASK", "ON_HARDWARE", "PREV", "APPLIED")
    assert staged.store.counts() | {r: edges(staged, r) for r in rels} == \
        reference.store.counts() | {r: edges(reference, r) for r in rels}
    assert staged.store.lineage("k-00022") == reference.store.lineage("k-00022")
    for memory in (staged, reference):
        memory.close()


@pytest.mark.parametrize("staged", [False, True], ids=["direct", "staged"])
def test_children_before_their_parents_several_chunks_back_import_with_every_edge(tmp_path, monkeypatch, staged):
    # Kùzu's COPY does not keep a file's order in the database, so the export of a home that once imported can list
    # a child before its parent (45 of 250k attempts in one such export); its restore into an empty home was
    # refused ("names parent_id ... which is neither in the memory nor earlier in the file").
    from kope_mcp.memory import bulk

    attempts = chain(23)
    path = tmp_path / "export.jsonl"
    write_export(path, attempts)
    reference = ExperienceMemory.open(tmp_path / "reference.kuzu", embeddings=False)
    import_memory(reference, path)
    reversed_path = tmp_path / "reversed.jsonl"
    write_export(reversed_path, attempts[::-1])  # every child before its parent, most of them chunks before
    monkeypatch.setattr(memory_admin, "CHUNK_ROWS", {"session": 1, "lesson": 2, "attempt": 4, "embedding": 3})
    monkeypatch.setattr(bulk, "DEFERRED_ROWS", 5)
    memory = ExperienceMemory.open(tmp_path / "memory.kuzu", embeddings=False)
    if staged:
        memory.prepare_bulk()
    report = import_memory(memory, reversed_path)
    if staged:
        memory.finish_bulk(completed=True)
    assert report.added["attempt"] == 23
    rels = ("IN_SESSION", "FOR_TASK", "ON_HARDWARE", "PREV", "APPLIED")
    assert memory.store.counts() | {r: edges(memory, r) for r in rels} == \
        reference.store.counts() | {r: edges(reference, r) for r in rels}
    for kernel in ("k-00009", "k-00022"):
        assert memory.store.lineage(kernel) == reference.store.lineage(kernel)
    again = import_memory(memory, reversed_path)  # nothing new, and no edge twice
    assert not again.added and edges(memory, "PREV") == 22
    for opened in (memory, reference):
        opened.close()


def test_a_parent_that_is_nowhere_is_refused_with_its_line_even_when_later_lines_could_have_held_it(
        tmp_path, monkeypatch):
    monkeypatch.setattr(memory_admin, "CHUNK_ROWS", {"session": 2, "lesson": 2, "attempt": 4, "embedding": 3})
    attempts = chain(9)[::-1]
    attempts[1] = attempts[1].model_copy(update={"parent_id": "k-99999"})
    path = tmp_path / "export.jsonl"
    write_export(path, attempts)
    memory = ExperienceMemory.open(tmp_path / "memory.kuzu", embeddings=False)
    with pytest.raises(InvalidExportError) as refused:
        import_memory(memory, path)
    assert "export.jsonl:8:" in str(refused.value) and "'k-99999'" in str(refused.value)
    assert "anywhere in the file" in str(refused.value)
    memory.close()


def test_an_imported_strategy_merges_into_this_memorys_own_by_canonical_key(tmp_path):
    memory = ExperienceMemory.open(tmp_path / "memory.kuzu", embeddings=False)
    try:
        own = memory.canonical_strategy("Unrolled by four")  # another id and spelling, the same canonical key
        assert own.strategy_id != "st-1"
        path = tmp_path / "export.jsonl"
        write_export(path, chain(5), extra=[
            ("lesson", LessonRecord(lesson_id="x-1", text="unrolling helped", strategy="unroll by four",
                                    strategy_id="st-1", task_id="relu", family="activation", label="lesson",
                                    verified=False, confidence=0.5, created_at="2026-01-01").model_dump()),
            ("embedding", {"id": "st-1", "item_kind": "strategy", "model": "all-MiniLM-L6-v2", "vector": unit(1)})])
        report = import_memory(memory, path)
        assert report.skipped_existing["strategy"] == 1 and report.skipped_existing["embedding"] == 1
        assert [s.strategy_id for s in memory.store.strategies()] == [own.strategy_id]
        assert {memory.attempt(f"k-{n:05d}").strategy_id for n in (1, 3, 5)} == {own.strategy_id}
        assert memory.store.lesson("x-1").strategy_id == own.strategy_id
        assert edges(memory, "APPLIED") == 3  # the three attempts, to this memory's strategy
        assert int(memory.store._rows("MATCH (:Lesson)-[:ABOUT]->(s:Strategy) RETURN count(s) AS c")[0]["c"]) == 1
    finally:
        memory.close()
