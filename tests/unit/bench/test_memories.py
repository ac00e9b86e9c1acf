"""The bench's memories of a chosen size: a seeded, family-stratified sample that imports whole (real Kùzu)."""

import json

from kope_mcp.bench.memories import attempts_in, subsample_export
from kope_mcp.memory.admin import export_memory, import_memory
from kope_mcp.services.workbench import Workbench
from tests.conftest import VECTOR_ADD_OK, make_settings
from tests.memory_helpers import run_sum_session


def _families(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    counts: dict[str, int] = {}
    for row in rows:
        if row["kind"] == "attempt":
            counts[row["family"]] = counts.get(row["family"], 0) + 1
    return rows, counts


def test_a_sampled_memory_keeps_each_familys_share_and_imports_without_edits_or_broken_links(workbench, tmp_path):
    run_sum_session(workbench)
    first = workbench.compile_kernel("vector_add", VECTOR_ADD_OK, strategy="plain loop")
    for flags in (["-O2"], ["-O3"], ["-O3", "-march=native"]):
        workbench.compile_kernel("vector_add", VECTOR_ADD_OK, session_id=first.session_id, parent_id=first.kernel_id,
                                 strategy=f"flags {' '.join(flags)}", flags=flags)
    full = tmp_path / "full.jsonl"
    export_memory(workbench.memory, full)
    _, whole = _families(full)
    assert set(whole) >= {"reduction", "elementwise"}
    sample = tmp_path / "sample.jsonl"
    kept = subsample_export(full, sample, 4, seed=7)
    rows, counts = _families(sample)
    assert kept == attempts_in(sample) == 4
    total = sum(whole.values())
    for family, n in whole.items():  # each family's share, to within one attempt
        assert abs(counts.get(family, 0) - 4 * n / total) < 1
    kept_ids = {r["kernel_id"] for r in rows if r["kind"] == "attempt"}
    assert all(r.get("parent_id") in kept_ids | {None} for r in rows if r["kind"] == "attempt")
    assert all(r.get("attempt_id") in kept_ids for r in rows if r["kind"] == "lesson")
    assert subsample_export(full, tmp_path / "again.jsonl", 4, seed=7) == 4
    assert (tmp_path / "again.jsonl").read_text() == sample.read_text()  # seeded
    fresh = Workbench(make_settings(tmp_path / "fresh"), workbench.tasks)
    report = import_memory(fresh.memory, sample)
    assert report.edited == {} and report.added["attempt"] == 4
    assert not any(a.suspect for a in fresh.store.all_attempts())
