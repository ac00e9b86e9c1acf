"""Memories of a chosen size for the bench: exports and imports through `kope memory`, and the warmed memory
cut to its N oldest attempts (with their sessions, lessons and vectors), so outcomes can be read against
memory size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def kope_memory(home: Path, action: str, file: Path) -> str:
    """`kope memory export|import FILE` on a home no server holds."""
    done = subprocess.run([sys.executable, "-m", "kope_mcp", "memory", action, str(file)],
                          env={**os.environ, "KOPE_HOME": str(home)}, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"kope memory {action} {file} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def truncate_export(source: Path, dest: Path, attempts: int) -> int:
    """Write `dest`: `source` (a kope-memory export) keeping only its `attempts` oldest attempts and what belongs
    to them. Returns how many attempts were kept."""
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    tried = sorted((r for r in rows if r["kind"] == "attempt"), key=lambda r: (r["created_at"], r["kernel_id"]))
    kept = tried[:attempts]
    kept_ids = {r["kernel_id"] for r in kept}
    cutoff = kept[-1]["created_at"] if kept else ""
    sessions = {r["session_id"] for r in kept}
    lessons = {r["lesson_id"] for r in rows if r["kind"] == "lesson" and
               (r.get("attempt_id") in kept_ids or (r.get("attempt_id") is None and r["created_at"] <= cutoff))}
    out = []
    for row in rows:
        kind = row["kind"]
        if kind == "attempt" and row["kernel_id"] not in kept_ids:
            continue
        if kind == "session":
            if row["session_id"] not in sessions:
                continue
            if row.get("incumbent_id") not in kept_ids:
                row = {**row, "incumbent_id": None}
        if kind == "lesson" and row["lesson_id"] not in lessons:
            continue
        if kind == "embedding" and row["id"] not in kept_ids | lessons:
            continue
        out.append(json.dumps(row, separators=(",", ":")))
    dest.write_text("\n".join(out) + "\n", encoding="utf-8")
    return len(kept)


def attempts_in(export: Path) -> int:
    with export.open(encoding="utf-8") as fh:
        return sum(1 for line in fh if line.startswith('{"kind":"attempt"'))
