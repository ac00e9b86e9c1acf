"""A memory that does not open, said truly and recovered: `kope memory recover`.

Kùzu replays its write-ahead log (``memory.kuzu.wal``: what was written after the last checkpoint) when a database
opens after an unclean end; a damaged log made the replay fail (a duplicated primary key) or crash the process
outright (a segfault in the replay, measured here with a flipped byte every 97). So an open is first tried in a
child process whenever a log is there to replay, and a failure is reported as what it is, never as "in use".

Recovery keeps what can be kept: the database file and its log are copied into ``KOPE_HOME/recovered-<time>/``,
the log is set aside, and the database opens as of its last checkpoint. The attempt journal
(``memory.kuzu.pending``: attempts acknowledged before they reached the graph) is left where it is; it is
replayed at the next open as always.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from kope_mcp.errors import KopeError

PROBE_TIMEOUT_S = 120.0
_PROBE = """
import json, sys
from pathlib import Path
from kope_mcp.memory.store import KuzuExperienceStore
store = KuzuExperienceStore(Path(sys.argv[1]))
print(json.dumps(store.counts()))
store.close()
"""


class MemoryDamagedError(KopeError):
    code = "memory_damaged"


class Probe(BaseModel):
    opens: bool
    detail: str = ""
    counts: dict[str, int] | None = None


class RecoveryReport(BaseModel):
    opened_before: bool
    backup: str | None = None
    set_aside: list[str] = []
    counts: dict[str, int] | None = None
    message: str


def wal_of(memory_path: Path) -> Path:
    return memory_path.with_name(memory_path.name + ".wal")


def probe(memory_path: Path) -> Probe:
    """Open the memory in a child process (a damaged log can crash the opener): does it open, and with what."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, str(memory_path)], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return Probe(opens=False, detail=f"opening it did not finish within {PROBE_TIMEOUT_S:.0f} s")
    if done.returncode == 0:
        return Probe(opens=True, counts=json.loads(done.stdout.strip().splitlines()[-1]))
    if done.returncode < 0:
        return Probe(opens=False, detail=f"opening it crashed the process (signal {-done.returncode})")
    last = (done.stderr.strip().splitlines() or ["no message"])[-1]
    return Probe(opens=False, detail=last[:300])


def check_opens(memory_path: Path) -> None:
    """Raise MemoryDamagedError, with what to do, when a log is there to replay and the memory does not open;
    without a log (a clean end) there is nothing to replay and nothing is tried."""
    wal = wal_of(memory_path)
    if not wal.exists() or wal.stat().st_size == 0:
        return
    found = probe(memory_path)
    if not found.opens:
        raise MemoryDamagedError(f"the memory at {memory_path} does not open: {found.detail}. `kope memory recover` "
                                 "keeps a copy of everything and opens it as of its last checkpoint")


def recover(memory_path: Path) -> RecoveryReport:
    """Open the memory as of its last checkpoint when its log cannot be replayed; every file is kept in a copy.
    The caller owns the home (no server on it)."""
    before = probe(memory_path)
    if before.opens:
        return RecoveryReport(opened_before=True, counts=before.counts,
                              message=f"{memory_path} opens: nothing to recover")
    backup = memory_path.parent / time.strftime("recovered-%Y%m%dT%H%M%S")
    backup.mkdir(mode=0o700)
    wal = wal_of(memory_path)
    kept = [p for p in (memory_path, wal) if p.exists()]
    for path in kept:
        shutil.copy2(path, backup / path.name)
    if wal.exists():
        wal.unlink()
    after = probe(memory_path)
    names = [p.name for p in kept]
    if after.opens:
        return RecoveryReport(
            opened_before=False, backup=str(backup), set_aside=[wal.name] if wal.name in names else [],
            counts=after.counts,
            message=(f"{memory_path} did not open ({before.detail}); it opens now as of its last checkpoint: "
                     f"what was written after it could not be replayed. Copies of {', '.join(names)} are in "
                     f"{backup}"))
    for name in names:  # no worse than before: the files as they were
        shutil.copy2(backup / name, memory_path.parent / name)
    raise MemoryDamagedError(f"{memory_path} does not open even without its log ({after.detail}): the database "
                             f"file itself is damaged. Copies are in {backup}; start a new home and `kope memory "
                             "import` your last export into it")
