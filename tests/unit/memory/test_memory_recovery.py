"""A memory whose write-ahead log cannot be replayed: said as what it is (not "in use", not a crash), and
`kope memory recover` opens it as of its last checkpoint with every file kept in a copy."""

import subprocess
import sys

import pytest

from kope_mcp.app.cli import main
from kope_mcp.memory.recovery import wal_of
from kope_mcp.memory.store import KuzuExperienceStore

pytestmark = pytest.mark.slow  # child processes that open a database

# A checkpointed task, then another left only in the log by a process that ends like kill -9.
WRITE = """
import os, sys
from pathlib import Path
from kope_mcp.memory.store import KuzuExperienceStore
store = KuzuExperienceStore(Path(sys.argv[1]))
store.upsert_task("kept", "elementwise", 1, "checkpointed")
store._exec("CHECKPOINT")
for i in range(50):
    store.upsert_task(f"late{i}", "elementwise", 1, "only in the log")
os._exit(0)
"""


@pytest.fixture
def damaged(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    path = home / "memory.kuzu"
    subprocess.run([sys.executable, "-c", WRITE, str(path)], check=True, timeout=120)
    wal = wal_of(path)
    log = wal.read_bytes()
    assert log
    # The log is replayed into the file at the next open; the same log put back then inserts every late task a
    # second time: the replay fails on a duplicated primary key, as killed imports left homes before.
    KuzuExperienceStore(path).close()
    assert not wal.exists() or wal.stat().st_size == 0
    wal.write_bytes(log)
    monkeypatch.setenv("KOPE_HOME", str(home))
    monkeypatch.setenv("KOPE_EMBEDDINGS", "off")
    return home


def test_a_memory_whose_log_cannot_be_replayed_is_said_to_be_damaged_and_recovered_to_its_checkpoint(
        damaged, capsys):
    assert main(["memory", "stats"]) == 2  # not a segfault, not "in use by another process"
    err = capsys.readouterr().err
    assert "memory_damaged:" in err and "does not open" in err and "kope memory recover" in err
    assert main(["memory", "recover"]) == 0
    said = capsys.readouterr().out
    assert "opens now as of its last checkpoint" in said and "recovered-" in said
    backups = list(damaged.glob("recovered-*"))
    assert len(backups) == 1 and {p.name for p in backups[0].iterdir()} == {"memory.kuzu", "memory.kuzu.wal"}
    store = KuzuExperienceStore(damaged / "memory.kuzu")
    try:
        assert store.has_node("Task", "id", "kept") and store.has_node("Task", "id", "late0")
    finally:
        store.close()
    assert main(["memory", "recover"]) == 0
    assert "nothing to recover" in capsys.readouterr().out


def test_a_server_on_a_damaged_memory_says_so_instead_of_crashing(damaged):
    from kope_mcp.memory.recovery import MemoryDamagedError
    from kope_mcp.services.workbench import Workbench
    from kope_mcp.settings import KopeSettings

    with pytest.raises(MemoryDamagedError, match="kope memory recover"):
        Workbench(KopeSettings.from_env())
