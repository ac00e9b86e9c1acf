"""Memories of a chosen size for the bench: exports and imports through `kope memory`, and the warmed memory
cut to a seeded, family-stratified sample of N attempts (with their sessions, lessons and vectors), so outcomes
can be read against memory size."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from kope_mcp.memory.admin import export_line


def kope_memory(home: Path, action: str, file: Path) -> str:
    """`kope memory export|import FILE` on a home no server holds."""
    done = subprocess.run([sys.executable, "-m", "kope_mcp", "memory", action, str(file)],
                          env={**os.environ, "KOPE_HOME": str(home)}, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"kope memory {action} {file} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def subsample_export(source: Path, dest: Path, attempts: int, seed: int) -> int:
    """Write `dest`: `source` (a kope-memory export) keeping a seeded sample of `attempts` of its attempts,
    stratified by family (each family keeps its share of the whole, largest remainders first), and what belongs
    to them: their sessions, lessons and vectors. A kept attempt whose parent was left out is linked to its
    nearest kept ancestor. Returns how many attempts were kept.

    Why a stratified sample and not the oldest N: the warm-up runs family after family, so its oldest attempts
    held nothing for some held-out families, and memory size was confounded with family coverage."""
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    tried = sorted((r for r in rows if r["kind"] == "attempt"), key=lambda r: (r["created_at"], r["kernel_id"]))
    by_family: dict[str, list[dict[str, object]]] = {}
    for row in tried:
        by_family.setdefault(str(row.get("family") or "?"), []).append(row)
    n = min(attempts, len(tried))
    exact = {f: n * len(rs) / max(1, len(tried)) for f, rs in by_family.items()}
    quota = {f: int(q) for f, q in exact.items()}
    for f in sorted(exact, key=lambda f: (-(exact[f] - quota[f]), f))[:n - sum(quota.values())]:
        quota[f] += 1
    kept_ids: set[str] = set()
    for family in sorted(by_family):
        chosen = list(by_family[family])
        random.Random(f"memory-sample/{seed}/{family}").shuffle(chosen)
        kept_ids |= {str(r["kernel_id"]) for r in chosen[:quota[family]]}
    parents = {str(r["kernel_id"]): r.get("parent_id") for r in tried}

    def kept_ancestor(kernel_id: object) -> object:
        seen = set()
        while kernel_id is not None and kernel_id not in kept_ids and kernel_id not in seen:
            seen.add(kernel_id)
            kernel_id = parents.get(str(kernel_id))
        return kernel_id if kernel_id in kept_ids else None

    sessions = {r["session_id"] for r in tried if r["kernel_id"] in kept_ids}
    lessons = {r["lesson_id"] for r in rows if r["kind"] == "lesson" and r.get("attempt_id") in kept_ids}
    out = []
    for row in rows:
        kind = row["kind"]
        changed: dict[str, object] = {}
        if kind == "attempt":
            if row["kernel_id"] not in kept_ids:
                continue
            if row.get("parent_id") is not None and row["parent_id"] not in kept_ids:
                changed = {"parent_id": kept_ancestor(row["parent_id"]), "diff_from_parent": ""}
        if kind == "session":
            if row["session_id"] not in sessions:
                continue
            if row.get("incumbent_id") is not None and row.get("incumbent_id") not in kept_ids:
                changed = {"incumbent_id": None}
        if kind == "lesson" and row["lesson_id"] not in lessons:
            continue
        if kind == "embedding" and row["id"] not in kept_ids | lessons:
            continue
        if changed:  # the sample is this home's own derivation: re-sealed, not "edited after its export"
            fields = {k: v for k, v in row.items() if k not in ("kind", "sha256")}
            out.append(export_line(kind, {**fields, **changed}))
        else:
            out.append(json.dumps(row, separators=(",", ":")))
    dest.write_text("\n".join(out) + "\n", encoding="utf-8")
    return len(kept_ids)


def attempts_in(export: Path) -> int:
    with export.open(encoding="utf-8") as fh:
        return sum(1 for line in fh if line.startswith('{"kind":"attempt"'))
