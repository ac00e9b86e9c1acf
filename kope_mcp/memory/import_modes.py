"""How an export gets into a home, all or nothing: in place in one transaction when it is small (it writes what
it adds), through a staging copy of the closed database when it is large (bulk writes, bounded memory). The caller
owns the home: no server on it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from kope_mcp.memory.admin import HomeSeal, ImportReport, import_memory
from kope_mcp.memory.experience_memory import SIDECARS, ExperienceMemory

STAGING_SUFFIX = ".importing"


def import_into_copy(memory_path: Path, export: Path,
                     open_memory: Callable[[Path], ExperienceMemory], seal: HomeSeal | None = None) -> ImportReport:
    """Import ``export`` all or nothing: into a copy of the closed database at ``memory_path``, which replaces
    the original (one rename) only once the copy is complete and closed.

    An import killed in the middle of the database's own files left homes that never opened again (the
    write-ahead log's recovery failed on a duplicated primary key, 2 of 13 kills at 45-95%), and others with
    lessons that lost their links to task and strategy. Killed now, it leaves the original as it was and a
    staging copy the next import removes; an export that turns out invalid half-way adds nothing either. The
    caller must own the home (no server on it) and must have closed its own store on ``memory_path``."""
    staging = memory_path.with_name(memory_path.name + STAGING_SUFFIX)
    # The read index and the vector file beside the database go with it (the index's stamp names the database).
    sidecars = [(p.with_name(p.name + suffix), p.with_name(p.name + STAGING_SUFFIX + suffix))
                for suffix in SIDECARS for p in (memory_path,)]
    remove_staging(memory_path)
    if memory_path.exists():
        # copy2 keeps the modification times the read index's stamp names: a trusted index stays trusted.
        shutil.copy2(memory_path, staging)
        for current, copy in sidecars:
            if current.exists():
                shutil.copy2(current, copy)
    memory = open_memory(staging)
    memory.prepare_bulk()
    try:
        report = import_memory(memory, export, seal)
        memory.finish_bulk(completed=True)
    except BaseException:
        memory.finish_bulk(completed=False)
        memory.close()
        remove_staging(memory_path)
        raise
    memory.close()
    leftovers = [p for p in staging.parent.glob(staging.name + "*")
                 if p != staging and p not in {copy for _, copy in sidecars}]
    if leftovers:  # a clean close leaves the database file and its index alone; else the copy is not whole
        remove_staging(memory_path)
        raise OSError(f"the imported copy did not close cleanly ({', '.join(p.name for p in leftovers)}); the "
                      "memory is unchanged")
    for path in (staging, *(copy for _, copy in sidecars)):
        if path.exists():
            _fsync(path)
    # Killed between these renames, the index in place names another database file than the one in place (its
    # stamp), so it and the vectors are rebuilt from the graph at the next start: any order is safe.
    for current, copy in sidecars:
        if copy.exists():
            os.replace(copy, current)
    os.replace(staging, memory_path)
    _fsync(memory_path.parent)
    return report


# An export up to this size is imported into the memory itself, in one transaction: what it writes is what it adds
# (6 attempts into a 50k-lesson home of 64 MB: 1.6-2.4 MB written in place, 65-68 MB through a copy). A larger one
# goes through a staging copy (import_into_copy), whose bulk writes make a large import fast and bound its memory.
IN_PLACE_BYTES = 32 * 1024**2


def import_file(memory_path: Path, export: Path, open_memory: Callable[[Path], ExperienceMemory],
                seal: HomeSeal | None = None) -> ImportReport:
    """Import ``export`` all or nothing, in place when it is small, through a staging copy when it is large. The
    caller owns the home (no server on it)."""
    if not memory_path.exists() or export.stat().st_size > IN_PLACE_BYTES:
        return import_into_copy(memory_path, export, open_memory, seal)
    return import_in_place(memory_path, export, open_memory, seal)


def import_in_place(memory_path: Path, export: Path, open_memory: Callable[[Path], ExperienceMemory],
                    seal: HomeSeal | None = None) -> ImportReport:
    """Import ``export`` into the database at ``memory_path`` in one transaction: killed or failed before its
    commit, the graph is as it was, and the read index (which got its rows as they came) is rebuilt from the graph
    at the next start."""
    remove_staging(memory_path)
    memory = open_memory(memory_path)
    try:
        with memory.all_or_nothing():
            return import_memory(memory, export, seal)
    finally:
        memory.close()


def remove_staging(memory_path: Path) -> None:
    """Whatever an interrupted import left beside the database (the copy, its log and journal)."""
    for leftover in memory_path.parent.glob(memory_path.name + STAGING_SUFFIX + "*"):
        leftover.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
