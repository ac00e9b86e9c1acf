"""`kope memory ...`: statistics (asked of the server that owns the home when one does), one item, export,
import (optionally re-measuring imported wins here) and recovery of a memory that does not open."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kope_mcp.settings import KopeSettings


def _stats_from_owner(home: Any) -> str | None:
    """The memory's statistics from the process that owns the home (its kope://memory/stats resource), or None
    when nothing serves the home or it cannot be reached."""
    from kope_mcp.app import daemon

    state = daemon.running(home)
    if state is None:
        return None
    import anyio
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from kope_mcp.app.http_server import MCP_PATH

    async def read() -> str:
        transport = streamable_http_client(state.url.rstrip("/") + MCP_PATH, http_client=daemon.http_client(state))
        with anyio.fail_after(30):
            async with Client(transport) as client:
                result = await client.read_resource("kope://memory/stats")
        return "".join(getattr(part, "text", "") for part in result.contents)

    try:
        return anyio.run(read)
    except Exception:  # an owner that does not answer: fall back to taking the home, as before
        return None


def free_home(home: Any, purpose: str) -> str | None:
    """Give this command the home's database. An on-demand daemon is stopped (clients start a new one, with every
    acknowledged write, on their next call); a server someone started is left alone. The refusal line, or None."""
    from kope_mcp.app import daemon

    state = daemon.running(home)
    if state is None:
        return None
    if state.holder:
        return f"error: {home} is held by `{state.holder}` (pid {state.pid}): run this again when it has finished"
    if not state.on_demand:
        return (f"error: {home} is served by pid {state.pid} ({state.url or 'kope serve --no-daemon'}); "
                f"`kope {purpose}` needs its database to itself: stop that server first")
    try:
        daemon.stop(home)
    except daemon.DaemonError as exc:
        return f"error: {exc}"
    print(f"stopped the home's on-demand daemon (pid {state.pid}) for `kope {purpose}`: a call it was running "
          "answers `server_stopping:` (nothing recorded) and clients start a new daemon on their next call",
          file=sys.stderr)
    return None


def memory_command(action: str, target: str | None, reverify: bool = False) -> int:
    from kope_mcp.settings import KopeSettings

    if action not in ("stats", "recover") and not target:
        print(f"usage: kope memory {action} {'ID' if action == 'show' else 'FILE.jsonl'}", file=sys.stderr)
        return 2
    settings = KopeSettings.from_env()
    if action == "import":
        settings.ensure_home()  # a home an import creates is 0700 like any other
    if action == "stats":
        served = _stats_from_owner(settings.home)
        if served is not None:  # read-only: asked of the server that owns the home, which keeps serving
            print(served)
            return 0
    refusal = free_home(settings.home, f"memory {action}")
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return 2
    ownership = hold_home(settings.home, f"kope memory {action}")
    if ownership is None:
        print(f"error: a client started a daemon on {settings.home} just now; run the command again, or "
              "`kope daemon stop` first", file=sys.stderr)
        return 2
    try:
        return _on_held_home(action, target, reverify, settings)
    finally:
        ownership.release()


# The importer's page cache: without a cap Kùzu takes most of the machine's memory as the database grows (an import
# of a million lessons peaked at 1.3 GB); the import streams, so a bounded cache costs it little (the generated
# team memory of tools/bench_retrieval.py at 1M: 107 s and 883 MB at 384 MiB, 104 s and 1,043 MB at 512 MiB).
IMPORT_CACHE_BYTES = 384 * 1024**2


def hold_home(home: Any, holder: str) -> Any:
    """Own the home like a server does, for the length of one admin command, so that no daemon opens the memory
    under it (an import replaces the database file at its end: a daemon started meanwhile would have written into
    the old one, and lost what it acknowledged). Clients calling meanwhile get a `daemon_unavailable:` line naming
    the command. None when another process owns the home."""
    import os
    import time

    from kope_mcp.app import daemon

    ownership = daemon.claim(home)
    if ownership is not None:
        ownership.publish(daemon.DaemonState(pid=os.getpid(), url="", token=None, started_at=time.time(),
                                             on_demand=False, holder=holder))
    return ownership


def _on_held_home(action: str, target: str | None, reverify: bool, settings: KopeSettings) -> int:
    import json
    from pathlib import Path

    from kope_mcp.errors import KopeError
    from kope_mcp.memory.admin import export_memory, home_seal, memory_stats, show_item
    from kope_mcp.memory.experience_memory import ExperienceMemory
    from kope_mcp.memory.recovery import MemoryDamagedError, recover

    try:
        if action == "recover":
            print(recover(settings.memory_path).message)
            return 0
        # No embedding model here: export/import carry the vectors, stats and show do not need them.
        memory = ExperienceMemory.open(settings.memory_path, embeddings=False, why_off=(
            "not loaded by `kope memory` (a server loads it)" if settings.embeddings else
            "disabled by KOPE_EMBEDDINGS=off"))
    except MemoryDamagedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # kuzu reports a held lock as a RuntimeError
        print(f"error: the memory in {settings.home} is in use by another process ({str(exc)[:120]}); a client may "
              "just have started its daemon: run the command again, or `kope daemon stop` first", file=sys.stderr)
        return 2
    try:
        if action == "stats":
            print(json.dumps(memory_stats(memory).model_dump(), indent=1))
        elif action == "show":
            print(json.dumps(show_item(memory, str(target)), indent=1, default=str))
        elif action == "export":
            counts = export_memory(memory, Path(str(target)), home_seal(settings.home))
            print(f"exported to {target}: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
        else:
            memory.close()  # checkpointed: the import opens the memory itself (import_file)
            report = _import(settings, Path(str(target)))
            print(f"imported from {target}: added {report.added or 'nothing'}; "
                  f"already present {report.skipped_existing or 'nothing'}"
                  + (f"; measured elsewhere ({report.origin}): served as evidence from that home, never as a "
                     "win here" if report.origin else "; this home's own export"))
            if report.edited:
                print(f"warning: records changed after the export (their sha256 does not match): {report.edited}; "
                      "edited lessons were left out, edited attempts kept as suspect (never taught)",
                      file=sys.stderr)
            if report.unhashed:
                print(f"note: {report.unhashed} records carry no sha256 (an export from before hashes); taken as "
                      "they are", file=sys.stderr)
            if reverify and not report.origin:
                print("--reverify: this home's own export: its measurements were made here already")
            elif reverify:
                return _reverify(settings, report.origin)
    except (KopeError, OSError) as exc:
        print(exc, file=sys.stderr)
        return 2
    finally:
        memory.close()
    return 0


def _import(settings: KopeSettings, export: Any) -> Any:
    """import_file with a bounded page cache; once more without the bound when Kùzu needs more than it (the
    first try changed nothing: imports are all or nothing)."""
    from kope_mcp.memory.admin import home_seal
    from kope_mcp.memory.experience_memory import ExperienceMemory
    from kope_mcp.memory.import_modes import import_file

    for cache in (IMPORT_CACHE_BYTES, 0):
        def opener(path: Any, cache: int = cache) -> ExperienceMemory:
            return ExperienceMemory.open(path, embeddings=False, cache_bytes=cache)

        try:
            return import_file(settings.memory_path, export, opener, home_seal(settings.home))
        except RuntimeError as exc:  # Kùzu's own: "Buffer manager exception: ... The buffer pool is full ..."
            if cache == 0 or "buffer pool is full" not in str(exc):
                raise
            print(f"note: the import needs more than {IMPORT_CACHE_BYTES >> 20} MiB of page cache for this memory; "
                  "importing again without that bound", file=sys.stderr)
    raise AssertionError("unreachable")


def _reverify(settings: KopeSettings, origin: str) -> int:
    from kope_mcp.memory.experience_memory import ExperienceMemory
    from kope_mcp.services.reverify import imported_wins, reverify
    from kope_mcp.services.workbench import Workbench

    workbench = Workbench(settings, memory=ExperienceMemory.open(settings.memory_path, embeddings=False))
    try:
        wins = imported_wins(workbench, origin)
        print(f"--reverify: {len(wins)} imported wins to measure here (compile, run_tests, profile each)", flush=True)
        for r in reverify(workbench, wins, progress=lambda line: print("  " + line, flush=True)):
            here = "no verdict" if r.here_label is None else r.here_label + (
                f" {r.here_speedup:.2f}x" if r.here_speedup is not None else "")
            print(f"{r.imported_id} ({r.task_id}): imported {r.there}; here {here}"
                  + (f" as {r.here_id}" if r.here_id else "") + (f" ({r.note})" if r.note else ""))
    finally:
        workbench.memory.close()
    return 0
