"""`kope memory import --reverify`: an imported win is measured again here, and only that measurement teaches."""

import json
from pathlib import Path

import pytest

from kope_mcp.experience.service import ExperienceService
from kope_mcp.memory.admin import HomeSeal, _line_hash, export_memory, import_memory
from kope_mcp.services.reverify import imported_wins, reverify
from kope_mcp.services.workbench import Workbench
from tests.conftest import VECTOR_ADD_OK, make_settings

pytestmark = pytest.mark.slow


def _forged_export(workbench: Workbench, tmp_path) -> tuple[Path, str]:
    """A home's export in which its naive vector_add loop became a 55x win (the line's hash computed again)."""
    naive = workbench.compile_kernel("vector_add", VECTOR_ADD_OK, strategy="plain loop")
    assert workbench.run_tests(naive.kernel_id).passed
    workbench.profile_kernel(naive.kernel_id, time_reference=False)
    path = tmp_path / "memory.jsonl"
    export_memory(workbench.memory, path, seal=HomeSeal("home-a", b"key of home-a".ljust(32, b".")))
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if f'"kernel_id":"{naive.kernel_id}"' in line)
    row = json.loads(lines[at]) | {"label": "effective", "speedup": 55.0, "speedup_ci_low": 50.0,
                                   "confidence": 0.99, "suspect": False, "noisy": False}
    kind = row.pop("kind")
    row["sha256"] = _line_hash(kind, row)
    lines[at] = json.dumps({"kind": kind, **row}, separators=(",", ":"))
    path.write_text("\n".join(lines) + "\n")
    return path, naive.kernel_id


def test_a_forged_import_whose_hash_was_recomputed_is_measured_here_for_what_it_is(workbench, tmp_path):
    path, naive_id = _forged_export(workbench, tmp_path)
    other = Workbench(make_settings(tmp_path / "home-b"), workbench.tasks)
    try:
        _reverify_forged(other, path, naive_id)
    finally:
        other.memory.close()


def test_a_local_child_of_an_imported_attempt_is_measured_from_local_evidence_in_a_session_of_its_own(
        workbench, tmp_path):
    path, naive_id = _forged_export(workbench, tmp_path)
    other = Workbench(make_settings(tmp_path / "home-b"), workbench.tasks)
    try:
        import_memory(other.memory, path, seal=HomeSeal("home-b", b"key of home-b".ljust(32, b".")))
        imported = other.store.attempt(naive_id)
        assert imported.origin and imported.speedup == 55.0
        # Asked from inside the imported session, the hot tier says whose measurement its latest attempt is.
        answer = ExperienceService(other.memory, other.tasks).query_experience(
            "what next?", session_id=imported.session_id, token_budget=3000)
        assert f"Latest: {naive_id} (imported from {imported.origin}, measured there" in answer.context
        # Its parent and the imported session's id, as an agent that read them from an answer would pass them.
        child = other.compile_kernel("vector_add", VECTOR_ADD_OK, parent_id=naive_id,
                                     session_id=imported.session_id, strategy="the same loop, here")
        assert child.session_id != imported.session_id
        assert other.run_tests(child.kernel_id).passed
        other.profile_kernel(child.kernel_id, time_reference=False)
        here = other.store.attempt(child.kernel_id)
        assert here.parent_id == naive_id and here.origin == ""
        # Measured against this home's baseline (about 1x), never as x0.02 of the 55x claimed elsewhere.
        assert here.speedup is not None and here.step_ratio == pytest.approx(here.speedup)
        assert here.label != "negative", here
        assert other.store.attempt(naive_id).speedup == 55.0 and other.store.attempt(naive_id).label == "effective"
    finally:
        other.memory.close()


def _reverify_forged(other: Workbench, path, naive_id: str) -> None:
    report = import_memory(other.memory, path, seal=HomeSeal("home-b", b"key of home-b".ljust(32, b".")))
    assert not report.edited  # the hash cannot tell: only a measurement here can
    wins = imported_wins(other, report.origin)
    assert [w.kernel_id for w in wins] == [naive_id]

    [result] = reverify(other, wins)
    assert result.here_id and result.here_id != naive_id
    assert result.there.startswith("effective 55.00x") and report.origin in result.there
    here = other.store.attempt(result.here_id)
    assert here.origin == "" and here.label == result.here_label != "effective", result
    assert here.speedup is not None and here.speedup < 3.0
    # The imported attempt keeps what it claimed, as evidence from elsewhere; the pair is found together.
    assert other.store.attempt(naive_id).speedup == 55.0
    [note] = other.store.lessons_for_attempt(result.here_id)
    assert naive_id in note.text and "55.00x" in note.text and note.verified == here.teaches
    answer = ExperienceService(other.memory, other.tasks).query_experience(
        "what worked for vector add here?", task_id="vector_add", token_budget=3000)
    assert not any(i.tier == "warm" and i.kind == "case" and i.label == "effective" for i in answer.items)
