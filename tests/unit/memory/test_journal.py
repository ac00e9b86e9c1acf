"""Attempts acknowledged before they are in the graph: durable at once, read by everyone, replayed after a crash."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from kope_mcp.memory.store import KuzuExperienceStore
from tests.unit.memory.test_store import make_attempt, populated

# A server that acknowledges an attempt and dies before its graph writer ran (the store's lock is held, so the
# writer cannot take it, then the process exits without closing anything).
CRASHING_SERVER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from kope_mcp.memory.store import KuzuExperienceStore
    from tests.unit.memory.test_store import make_attempt
    store = KuzuExperienceStore(Path(sys.argv[1]))
    store._lock.acquire()
    store.add_attempt_soon(make_attempt("k-8", parent="k-3"))
    store.add_attempt_soon(make_attempt("k-9", parent="k-8"))
    print("acknowledged", flush=True)
    os._exit(0)
""")


def test_an_attempt_written_soon_is_read_at_once_and_leaves_the_journal_empty(tmp_path):
    store = populated(tmp_path)
    store.add_attempt_soon(make_attempt("k-4", parent="k-3"))
    store.add_attempt_soon(make_attempt("k-5", parent="k-4"))
    # No wait: the next statement, whoever runs it, writes what the journal holds first.
    assert store.attempt("k-5").parent_id == "k-4"
    assert {a.kernel_id for a in store.successors("k-4")} == {"k-5"}
    assert (tmp_path / "memory.kuzu.pending").stat().st_size == 0
    store.close()


def test_acknowledged_attempts_survive_a_server_that_dies_before_writing_them(tmp_path):
    populated(tmp_path).close()
    done = subprocess.run([sys.executable, "-c", CRASHING_SERVER, str(tmp_path / "memory.kuzu")],
                          capture_output=True, text=True, timeout=120, check=False,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.stdout.strip() == "acknowledged", done.stderr
    assert (tmp_path / "memory.kuzu.pending").read_text().count("\n") == 2
    store = KuzuExperienceStore(tmp_path / "memory.kuzu")
    assert store.attempt("k-9").parent_id == "k-8" and store.attempt("k-8").parent_id == "k-3"
    assert store.counts()["Attempt"] == 5
    assert (tmp_path / "memory.kuzu.pending").stat().st_size == 0
    store.close()
    # Replaying again (a crash right after the replay) adds nothing twice.
    assert KuzuExperienceStore(tmp_path / "memory.kuzu").counts()["Attempt"] == 5


def test_a_line_cut_short_by_a_crash_is_skipped_and_the_rest_replayed(tmp_path):
    populated(tmp_path).close()
    whole = make_attempt("k-6", parent="k-1").model_dump_json()
    (tmp_path / "memory.kuzu.pending").write_text(whole + "\n" + whole[: len(whole) // 2])
    store = KuzuExperienceStore(tmp_path / "memory.kuzu")
    assert store.attempt("k-6").parent_id == "k-1"
    assert store.counts()["Attempt"] == 4
    store.close()


def test_an_attempt_the_graph_refuses_is_set_aside_with_the_reason_never_dropped(tmp_path):
    store = populated(tmp_path)
    orphan = make_attempt("k-7").model_copy(update={"session_id": "s-nobody"})
    store.add_attempt_soon(orphan)
    assert store.counts()["Attempt"] == 3  # the reader is not failed by someone else's write
    aside = [json.loads(line) for line in (tmp_path / "memory.kuzu.pending.unapplied.jsonl").read_text().splitlines()]
    assert [a["attempt"]["kernel_id"] for a in aside] == ["k-7"] and "s-nobody" in aside[0]["why"]
    store.close()
