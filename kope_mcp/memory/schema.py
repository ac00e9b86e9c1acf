"""The experience graph's schema, as numbered migrations (each runs once and is recorded in KopeMigration)."""

from __future__ import annotations

from kope_mcp.memory.rows import (
    ATTEMPT_COLUMNS_V1,
    ATTEMPT_COLUMNS_V2,
    ATTEMPT_COLUMNS_V4,
    ATTEMPT_COLUMNS_V5,
    ATTEMPT_RENAMED_V3,
    LESSON_COLUMNS_V1,
    LESSON_COLUMNS_V3,
    LESSON_COLUMNS_V4,
    LESSON_COLUMNS_V5,
)

EMBEDDING_DIM = 384



def _table(name: str, columns: dict[str, str], key: str) -> str:
    body = ", ".join(f"{col} {typ}" for col, typ in columns.items())
    return f"CREATE NODE TABLE {name}({body}, PRIMARY KEY ({key}))"


# Numbered migrations; each runs once and is recorded in KopeMigration.
MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (1, "experience graph v1", [
        "CREATE NODE TABLE Task(id STRING, family STRING, level INT64, summary STRING, PRIMARY KEY (id))",
        "CREATE NODE TABLE Hardware(key STRING, arch STRING, cpu_model STRING, cores INT64, isa STRING, "
        "caches STRING, PRIMARY KEY (key))",
        "CREATE NODE TABLE Session(session_id STRING, task_id STRING, hardware_key STRING, agent_name STRING, "
        "agent_version STRING, agent_label STRING, created_at STRING, incumbent_id STRING, "
        "incumbent_speedup DOUBLE, PRIMARY KEY (session_id))",
        _table("Attempt", ATTEMPT_COLUMNS_V1, "kernel_id"),
        "CREATE NODE TABLE Strategy(strategy_id STRING, name STRING, key STRING, created_at STRING, "
        "PRIMARY KEY (strategy_id))",
        _table("Lesson", LESSON_COLUMNS_V1, "lesson_id"),
        f"CREATE NODE TABLE Embedding(id STRING, kind STRING, model STRING, vector FLOAT[{EMBEDDING_DIM}], "
        "PRIMARY KEY (id))",
        "CREATE REL TABLE PREV(FROM Attempt TO Attempt)",
        "CREATE REL TABLE IN_SESSION(FROM Attempt TO Session)",
        "CREATE REL TABLE FOR_TASK(FROM Session TO Task, FROM Attempt TO Task)",
        "CREATE REL TABLE ON_HARDWARE(FROM Session TO Hardware, FROM Attempt TO Hardware)",
        "CREATE REL TABLE APPLIED(FROM Attempt TO Strategy)",
        "CREATE REL TABLE FROM_ATTEMPT(FROM Lesson TO Attempt)",
        "CREATE REL TABLE ABOUT(FROM Lesson TO Strategy, FROM Lesson TO Task)",
        # BM25 over strategy names and lessons: an attempt's text is its strategy (plus structured fields the
        # graph filters already cover), and an FTS index over every attempt cost ~30 ms per query at 100k.
        "CALL CREATE_FTS_INDEX('Strategy', 'strategy_fts', ['name'])",
        "CALL CREATE_FTS_INDEX('Lesson', 'lesson_fts', ['search_text'])",  # dropped by migration 6
    ]),
    (2, "suspect measurements", [
        f"ALTER TABLE Attempt ADD {name} {typ} DEFAULT {default}" for name, (typ, default) in ATTEMPT_COLUMNS_V2.items()
    ]),
    (3, "execution targets", [
        *(f"ALTER TABLE Attempt RENAME {old} TO {new}" for old, new in ATTEMPT_RENAMED_V3.items()),
        *(f"ALTER TABLE Lesson ADD {name} {typ} DEFAULT {default}"
          for name, (typ, default) in LESSON_COLUMNS_V3.items()),
        "MATCH (x:Lesson)-[:FROM_ATTEMPT]->(a:Attempt) SET x.target = a.target",
    ]),
    (4, "verdicts from the interval", [
        *(f"ALTER TABLE Attempt ADD {name} {typ}" + (f" DEFAULT {default}" if default else "")
          for name, (typ, default) in ATTEMPT_COLUMNS_V4.items()),
        *(f"ALTER TABLE Lesson ADD {name} {typ} DEFAULT {default}"
          for name, (typ, default) in LESSON_COLUMNS_V4.items()),
    ]),
    (5, "evidence from elsewhere", [
        *(f"ALTER TABLE Attempt ADD {name} {typ} DEFAULT {default}" for name, (typ, default) in
          ATTEMPT_COLUMNS_V5.items()),
        *(f"ALTER TABLE Lesson ADD {name} {typ} DEFAULT {default}" for name, (typ, default) in
          LESSON_COLUMNS_V5.items()),
    ]),
    # Lessons are searched by the read index (read_index.py): this index was rebuilt inside every COPY of lessons
    # (~60% of a million lessons' import) and could not be built once at the end within 1 GB.
    (6, "lesson search in the read index", [
        "CALL DROP_FTS_INDEX('Lesson', 'lesson_fts')",
    ]),
]
