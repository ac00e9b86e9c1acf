"""`kope memory import` is all or nothing: killed at any point, the home opens with what it held before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kope_mcp.app import daemon
from kope_mcp.memory import import_modes
from kope_mcp.memory.admin import FORMAT, VERSION, InvalidExportError, export_line
from kope_mcp.memory.experience_memory import ExperienceMemory
from kope_mcp.memory.import_modes import STAGING_SUFFIX
from kope_mcp.memory.read_index import ReadIndex, database_stamp
from kope_mcp.memory.records import LessonRecord
from kope_mcp.memory.store import KuzuExperienceStore
from kope_mcp.memory.terms import stem, stems

pytestmark = pytest.mark.slow  # subprocesses killed mid-import


def write_export(path: Path, lessons: int) -> None:
    """A valid export of ``lessons`` lessons on one task and strategy (what a team's memory mostly holds)."""
    rows = [{"format": FORMAT, "version": VERSION},
            {"kind": "task", "id": "relu", "family": "activation", "level": 1, "summary": "relu"},
            {"kind": "strategy", "strategy_id": "s-1", "name": "unroll by four", "key": "unroll by four",
             "created_at": "2026-01-01T00:00:00Z"}]
    for i in range(lessons):
        lesson = LessonRecord(lesson_id=f"x-imported-{i:06d}", text=f"lesson {i}: unrolling by four helped",
                              strategy="unroll by four", strategy_id="s-1", task_id="relu", family="activation",
                              verified=False, label="lesson", confidence=0.3, created_at="2026-01-01T00:00:00Z")
        rows.append({"kind": "lesson", **lesson.model_dump()})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def home_with_data(home: Path) -> int:
    home.mkdir(mode=0o700)
    store = KuzuExperienceStore(home / "memory.kuzu")
    store.upsert_task("relu", "activation", 1, "relu")
    before = store.counts()["Task"]
    store.close()
    return before


def served(home: Path) -> int:
    """Lessons whose words the read index counts once the memory has opened (rebuilding it if it was stale), and
    checks that it serves them."""
    memory = ExperienceMemory.open(home / "memory.kuzu", embeddings=False)
    memory.start()
    assert memory.wait_index(timeout=120)
    counted = memory.index.document_frequency(stems("helped")).get(stem("helped"), 0)
    assert len(memory.scoped_lessons("relu", "activation", None, 10)) == min(counted, 5)
    memory.stop()
    memory.close()
    return counted


def test_an_import_killed_part_way_leaves_the_home_as_it_was_and_a_rerun_imports_everything(tmp_path):
    export = tmp_path / "export.jsonl"
    write_export(export, 6000)
    env = {**os.environ, "KOPE_EMBEDDINGS": "off"}
    # Time a whole import once, then kill others at fractions of that.
    timing_home = tmp_path / "timing"
    home_with_data(timing_home)
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "kope_mcp", "memory", "import", str(export)], check=True, timeout=600,
                   env={**env, "KOPE_HOME": str(timing_home)}, capture_output=True)
    whole = time.monotonic() - start
    for fraction in (0.3, 0.6, 0.85, 0.95):
        home = tmp_path / f"home-{fraction}"
        home_with_data(home)
        proc = subprocess.Popen([sys.executable, "-m", "kope_mcp", "memory", "import", str(export)],
                                env={**env, "KOPE_HOME": str(home)}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(whole * fraction)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        store = KuzuExperienceStore(home / "memory.kuzu")  # opens: the original was never written to
        counts = store.counts()
        store.close()
        assert counts["Lesson"] in (0, 6000), (fraction, counts)  # nothing half-imported
        assert counts["Task"] == 1
        assert served(home) == counts["Lesson"], fraction  # the read index agrees with the graph
        rerun = subprocess.run([sys.executable, "-m", "kope_mcp", "memory", "import", str(export)], timeout=600,
                               env={**env, "KOPE_HOME": str(home)}, capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stderr
        store = KuzuExperienceStore(home / "memory.kuzu")
        counts = store.counts()
        linked = store._rows("MATCH (x:Lesson)-[:ABOUT]->(:Task) RETURN count(x) AS n")[0]["n"]
        store.close()
        assert counts["Lesson"] == 6000 and linked == 6000, (fraction, counts, linked)
        assert served(home) == 6000
        assert [p.name for p in home.iterdir() if ".importing" in p.name] == []


def test_an_import_killed_between_its_two_renames_leaves_an_index_that_is_rebuilt_from_the_graph(
        tmp_path, monkeypatch):
    export, earlier = tmp_path / "export.jsonl", tmp_path / "earlier.jsonl"
    write_export(earlier, 30)
    write_export(export, 50)  # the 30 and 20 more
    home = tmp_path / "home"
    home_with_data(home)
    open_memory = lambda path: ExperienceMemory.open(path, embeddings=False)  # noqa: E731
    import_modes.import_into_copy(home / "memory.kuzu", earlier, open_memory)
    renames: list[tuple[str, str]] = []
    real_replace = os.replace

    def killed_after_one(src: Path, dst: Path) -> None:
        if renames:
            raise KeyboardInterrupt  # the process ends here: the second rename never happens
        renames.append((Path(src).name, Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(import_modes.os, "replace", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        import_modes.import_into_copy(home / "memory.kuzu", export, open_memory)
    monkeypatch.undo()
    assert renames == [("memory.kuzu.importing.index", "memory.kuzu.index")]  # the new index, the old graph
    memory = ExperienceMemory.open(home / "memory.kuzu", embeddings=False)
    assert not memory.index.complete  # its stamp names the imported file, not this one
    memory.close()
    assert served(home) == 30


def test_an_import_holds_the_home_so_no_daemon_opens_the_memory_under_it(tmp_path):
    from kope_mcp.app import daemon

    export = tmp_path / "export.jsonl"
    write_export(export, 40000)
    home = tmp_path / "home"
    home_with_data(home)
    env = {**os.environ, "KOPE_EMBEDDINGS": "off", "KOPE_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "kope_mcp", "memory", "import", str(export)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while (state := daemon.running(home)) is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert state is not None and state.holder == "kope memory import" and state.pid == proc.pid, \
            proc.communicate()
        # A client's call meanwhile: one line naming the command, and no daemon started beside it.
        with pytest.raises(daemon.DaemonError, match="held by `kope memory import`"):
            daemon.ensure(home)
        second = subprocess.run([sys.executable, "-m", "kope_mcp", "memory", "stats"], env=env, timeout=120,
                                capture_output=True, text=True)
        assert second.returncode == 2 and "held by `kope memory import`" in second.stderr, second.stderr
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert daemon.running(home) is None  # let go at its end
    store = KuzuExperienceStore(home / "memory.kuzu")
    assert store.counts()["Lesson"] == 40000
    store.close()


def test_an_import_whose_page_cache_is_too_small_is_done_again_without_the_bound(tmp_path, monkeypatch, capsys):
    from kope_mcp.app import cli_memory
    from kope_mcp.settings import KopeSettings

    export = tmp_path / "export.jsonl"
    write_export(export, 3000)
    settings = KopeSettings.from_env(home=tmp_path / "home", embeddings=False)
    settings.ensure_home()
    monkeypatch.setattr(cli_memory, "IMPORT_CACHE_BYTES", 2 * 1024**2)  # too small for the COPYs
    report = cli_memory._import(settings, export)
    assert report.added == {"task": 1, "strategy": 1, "lesson": 3000}
    assert "importing again without that bound" in capsys.readouterr().err
    index = ReadIndex.beside(settings.memory_path)  # before the store below opens (and so changes) the database
    assert index.attach(database_stamp(settings.memory_path), database_empty=False)
    assert len(index.full_text("helped", 5000)) == 3000  # every lesson is searched by its words
    store = KuzuExperienceStore(settings.memory_path)
    assert store.counts()["Lesson"] == 3000
    store.close()


def test_the_homes_next_owner_removes_what_a_killed_import_left_and_a_second_claim_removes_nothing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    leftovers = [home / f"memory.kuzu{STAGING_SUFFIX}{suffix}" for suffix in ("", ".wal", ".index")]
    for path in leftovers:
        path.write_bytes(b"x" * 1024)
    (home / "memory.kuzu").write_bytes(b"the memory")
    owner = daemon.claim(home)
    assert owner is not None
    try:
        assert not any(p.exists() for p in leftovers) and (home / "memory.kuzu").read_bytes() == b"the memory"
        leftovers[0].write_bytes(b"an import the owner is running")
        assert daemon.claim(home) is None and leftovers[0].exists()  # not the owner: touches nothing
    finally:
        owner.release()


def _written_by_import(home: Path, export: Path) -> int:
    """Bytes `kope memory import` wrote (its write system calls: the database, its log, the read index)."""
    probe = ("import runpy, sys\nsys.argv = ['kope', 'memory', 'import', sys.argv[1]]\ntry:\n"
             "    runpy.run_module('kope_mcp', run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
             "io = dict(l.split(': ') for l in open('/proc/self/io').read().splitlines())\n"
             "print('WCHAR', io['wchar'], code, file=sys.stderr)\n")
    run = subprocess.run([sys.executable, "-c", probe, str(export)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "KOPE_EMBEDDINGS": "off", "KOPE_HOME": str(home)})
    line = next(x for x in run.stderr.splitlines() if x.startswith("WCHAR"))
    _, written, code = line.split()
    assert code in ("0", "None"), run.stderr
    return int(written)


def test_a_small_import_into_a_large_home_writes_what_it_adds_not_a_copy_of_the_home(tmp_path):
    from tests.unit.memory.test_memory_import_chunks import attempt
    from tests.unit.memory.test_memory_import_chunks import write_export as write_attempts

    home = tmp_path / "home"
    home_with_data(home)
    team = tmp_path / "team.jsonl"
    write_export(team, 50_000)
    _written_by_import(home, team)
    earlier, six = tmp_path / "earlier.jsonl", tmp_path / "six.jsonl"
    write_attempts(earlier, [attempt(n, parent=None) for n in range(1, 7)])  # a team's home has attempts too
    _written_by_import(home, earlier)
    size = sum(p.stat().st_size for p in home.iterdir() if p.name.startswith("memory.kuzu"))
    write_attempts(six, [attempt(n, parent=None) for n in range(7, 13)])
    written = _written_by_import(home, six)
    store = KuzuExperienceStore(home / "memory.kuzu")
    counts = store.counts()
    store.close()
    assert counts["Lesson"] == 50_000 and counts["Attempt"] == 12
    assert written < 10 * 1024**2, f"{written / 1e6:.1f} MB written for 6 attempts into a {size / 1e6:.0f} MB home"


def test_an_in_place_import_that_fails_half_way_leaves_the_graph_as_it_was_and_its_index_rebuilt(tmp_path):
    home = tmp_path / "home"
    home_with_data(home)
    export = tmp_path / "export.jsonl"
    write_export(export, 3000)
    from tests.unit.memory.test_memory_import_chunks import attempt

    with export.open("a") as fh:  # 3000 good lessons, written, then a line that refuses the whole file
        fh.write(export_line("attempt", attempt(1, None, session="s-nowhere").model_dump()) + "\n")
    open_memory = lambda path: ExperienceMemory.open(path, embeddings=False)  # noqa: E731
    with pytest.raises(InvalidExportError):
        import_modes.import_file(home / "memory.kuzu", export, open_memory)
    assert served(home) == 0  # the index had the 3000 as they came: it was rebuilt from the graph
    store = KuzuExperienceStore(home / "memory.kuzu")
    assert store.counts()["Lesson"] == 0 and store.counts()["Task"] == 1
    store.close()
