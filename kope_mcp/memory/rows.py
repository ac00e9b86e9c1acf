"""How records map to Kùzu node properties: column types, JSON-encoded lists, and row -> record conversion.

Pure Python (no Cypher, no kuzu import): store.py builds its DDL and queries from these columns.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from kope_mcp.memory.records import AgentInfo, AttemptRecord, LessonRecord, SessionRecord

# The Attempt table as migration 1 created it; later columns come from their own migrations (store.py).
ATTEMPT_COLUMNS_V1: dict[str, str] = {
    "kernel_id": "STRING", "session_id": "STRING", "task_id": "STRING", "family": "STRING",
    "hardware_key": "STRING", "backend": "STRING", "build_hash": "STRING", "source": "STRING",
    "source_hash": "STRING", "flags": "STRING", "ok": "BOOLEAN", "uses_openmp": "BOOLEAN", "parent_id": "STRING",
    "strategy": "STRING", "strategy_id": "STRING", "opt_layer": "STRING", "created_at": "STRING", "agent": "STRING",
    "error_signature": "STRING", "diff_from_parent": "STRING", "diagnostics_digest": "STRING",
    "tested": "BOOLEAN", "correct": "BOOLEAN",
    "failure": "STRING", "failure_message": "STRING", "median_s": "DOUBLE", "speedup": "DOUBLE",
    "speedup_ci_low": "DOUBLE", "speedup_vs_reference": "DOUBLE", "step_ratio": "DOUBLE", "label": "STRING",
    "confidence": "DOUBLE", "downstream": "DOUBLE", "profile_warnings": "STRING", "search_text": "STRING",
}
# Migration 2: a measurement that tripped an integrity check is never taught as a win.
ATTEMPT_COLUMNS_V2: dict[str, tuple[str, str]] = {"suspect": ("BOOLEAN", "false"), "suspect_reason": ("STRING", "''")}
# Migration 3: attempts name their execution target (c, triton, cuda, ...) and whatever a target needs to know
# about a build (OpenMP for C) lives with the build, not in the memory. The retired column stays in the table,
# unread and unwritten: kuzu 0.11.3 segfaults at the checkpoint after `ALTER TABLE ... DROP` and an update.
ATTEMPT_RENAMED_V3 = {"backend": "target"}
ATTEMPT_DROPPED_V3 = ("uses_openmp",)
# Migration 4: labels come from the speedup's interval, and a noisy measurement is kept apart from a clean one.
# No `DEFAULT NULL`: kuzu 0.11.3 writes it to the WAL untyped, and a home killed before its next checkpoint then
# never opened again ("Trying to a create a vector with ANY type"); a column added without a default is null.
ATTEMPT_COLUMNS_V4: dict[str, tuple[str, str]] = {"speedup_ci_high": ("DOUBLE", ""),
                                                  "noisy": ("BOOLEAN", "false"), "noise_reason": ("STRING", "''")}
# Migration 5: a measurement imported from another home says where it came from ('' for one made here).
ATTEMPT_COLUMNS_V5: dict[str, tuple[str, str]] = {"origin": ("STRING", "''")}
ATTEMPT_COLUMNS: dict[str, str] = {
    ATTEMPT_RENAMED_V3.get(k, k): t for k, t in ATTEMPT_COLUMNS_V1.items() if k not in ATTEMPT_DROPPED_V3
} | {k: t for k, (t, _) in ATTEMPT_COLUMNS_V2.items()} | {k: t for k, (t, _) in ATTEMPT_COLUMNS_V4.items()} | \
    {k: t for k, (t, _) in ATTEMPT_COLUMNS_V5.items()}
LESSON_COLUMNS_V1: dict[str, str] = {
    "lesson_id": "STRING", "text": "STRING", "strategy": "STRING", "strategy_id": "STRING", "opt_layer": "STRING",
    "rationale": "STRING", "task_id": "STRING", "family": "STRING", "hardware_key": "STRING",
    "attempt_id": "STRING", "verified": "BOOLEAN", "label": "STRING", "step_ratio": "DOUBLE", "speedup": "DOUBLE",
    "confidence": "DOUBLE", "agent": "STRING", "created_at": "STRING", "search_text": "STRING",
}
# Migration 3: a lesson about an attempt carries its target (None: knowledge not tied to a target).
LESSON_COLUMNS_V3: dict[str, tuple[str, str]] = {"target": ("STRING", "''")}
# Migration 4: a lesson written about another agent's attempt names that agent (its words are the writer's claim).
LESSON_COLUMNS_V4: dict[str, tuple[str, str]] = {"about_agent": ("STRING", "''")}
LESSON_COLUMNS_V5: dict[str, tuple[str, str]] = {"origin": ("STRING", "''")}
LESSON_COLUMNS: dict[str, str] = LESSON_COLUMNS_V1 | {k: t for k, (t, _) in LESSON_COLUMNS_V3.items()} | \
    {k: t for k, (t, _) in LESSON_COLUMNS_V4.items()} | {k: t for k, (t, _) in LESSON_COLUMNS_V5.items()}
JSON_FIELDS = ("flags", "profile_warnings")


def got_further(parent_ok: bool, child: AttemptRecord) -> bool:
    """The child fixed the parent's failure: it compiled where the parent did not, or it passed its tests."""
    return child.ok and (not parent_ok or bool(child.correct))


def attempt_props(record: AttemptRecord) -> dict[str, Any]:
    data = record.model_dump()
    for name in JSON_FIELDS:
        data[name] = json.dumps(data[name])
    data["search_text"] = attempt_search_text(record)
    return data


def attempt_search_text(record: AttemptRecord) -> str:
    parts: Iterable[str | None] = (record.task_id, record.family, record.target, record.strategy, record.opt_layer,
                                   " ".join(record.flags), record.error_signature, record.failure,
                                   record.failure_message[:300], record.label)
    return " ".join(p for p in parts if p)


def attempt_from_row(node: dict[str, Any]) -> AttemptRecord:
    data = {k: v for k, v in node.items() if k in ATTEMPT_COLUMNS and k != "search_text"}
    data.setdefault("source", "")  # summaries leave the source out
    for name in JSON_FIELDS:
        data[name] = json.loads(data.get(name) or "[]")
    return AttemptRecord.model_validate(data)


def lesson_from_row(node: dict[str, Any]) -> LessonRecord:
    data = {k: v for k, v in node.items() if k in LESSON_COLUMNS and k != "search_text"}
    data["target"] = data.get("target") or None
    return LessonRecord.model_validate(data)


def session_from_row(node: dict[str, Any]) -> SessionRecord:
    return SessionRecord(
        session_id=node["session_id"], task_id=node["task_id"], hardware_key=node["hardware_key"],
        agent=AgentInfo(name=node["agent_name"] or "unknown", version=node["agent_version"] or "",
                        label=node["agent_label"]),
        created_at=node["created_at"], incumbent_id=node["incumbent_id"],
        incumbent_speedup=node["incumbent_speedup"],
    )
