"""record_experience and query_experience: measured evidence first, phases, budgets, pitfalls, the why."""

import json

import pytest

from kope_mcp.errors import UnknownKernelError, UnknownSessionError, UnknownTaskError
from kope_mcp.experience.service import EmptyLessonError, ExperienceService
from kope_mcp.experience.tokens import CalibratedCharCounter, count_tokens
from kope_mcp.memory.admin import HomeSeal, export_line, export_memory, import_memory
from kope_mcp.memory.embedder import BackgroundEmbedder
from kope_mcp.memory.experience_memory import ExperienceMemory
from kope_mcp.memory.read_index import ReadIndex
from kope_mcp.services.workbench import Workbench
from tests.conftest import VECTOR_ADD_OK, make_settings
from tests.memory_helpers import ACCUMULATOR_STRATEGY, SUM_BROKEN, run_sum_session

HOME_1, HOME_A, HOME_B = (HomeSeal(name, f"the key of {name}".encode().ljust(32, b"."))
                          for name in ("home-1", "home-a", "home-b"))


def make_a_win(path, kernel_id: str, rehash: bool) -> None:
    """Edit an export so that ``kernel_id`` reads as a 55x win; ``rehash``: recompute the line's sha256 (the old
    ``mac`` stays: only the home's key could make a new one)."""
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if f'"kernel_id":"{kernel_id}"' in line
              and line.startswith('{"kind":"attempt"'))
    row = json.loads(lines[at]) | {"label": "effective", "speedup": 55.0, "confidence": 0.99}
    if rehash:
        kind, mac = row.pop("kind"), row.get("mac")
        row = json.loads(export_line(kind, row)) | {"mac": mac}
    lines[at] = json.dumps(row, separators=(",", ":"))
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def world(workbench):
    ids = run_sum_session(workbench)
    service = ExperienceService(workbench.memory, workbench.tasks)
    service.record_experience(ACCUMULATOR_STRATEGY, "independent accumulators break the add dependency chain",
                              kernel_id=ids["fast"], session_id=ids["session"],
                              rationale="a serial sum is bound by the add latency")
    service.record_experience("drop the tail loop", "always keep a scalar tail loop for n % 16",
                              kernel_id=ids["wrong"], session_id=ids["session"])
    return ids, service


def test_a_lesson_about_a_kernel_takes_its_measured_outcome(world, workbench):
    ids, service = world
    result = service.record_experience("OpenMP reduction", "this was 100x faster!", kernel_id=ids["wrong"],
                                       session_id=ids["session"])
    attempt = workbench.store.attempt(ids["wrong"])
    assert result.verified and result.label == attempt.label == "incorrect"
    assert result.attempt_id == ids["wrong"]


def test_a_lesson_without_a_kernel_is_unverified_and_ranks_below_measured_evidence(world):
    ids, service = world
    result = service.record_experience("16 accumulators", "Use many accumulators (I read it somewhere).",
                                       task_id="sum_reduce")
    assert not result.verified and result.label == "lesson" and result.confidence < 0.5
    answer = service.query_experience("accumulators", task_id="sum_reduce", phase="optimize", token_budget=4000)
    scores = {i.id: i.score for i in answer.items}
    assert scores[ids["fast"]] > scores[result.experience_id]


def test_near_identical_strategy_names_land_on_one_strategy(world):
    _, service = world
    a = service.record_experience("OpenMP over rows", "x", task_id="softmax")
    b = service.record_experience("omp over the rows", "y", task_id="softmax")
    assert a.strategy_id == b.strategy_id


def test_done_when_a_second_task_of_the_family_gets_the_winning_strategy_and_pitfalls_with_the_why(world):
    ids, service = world
    answer = service.query_experience("make the dot product faster", task_id="dot", token_budget=1500)
    by_id = {i.id: i for i in answer.items}
    assert ids["fast"] in by_id and by_id[ids["fast"]].kind == "case"
    assert "same family" in by_id[ids["fast"]].why
    assert ACCUMULATOR_STRATEGY in answer.context
    assert any(i.kind == "pitfall" for i in answer.items) and "AVOID" in answer.context
    assert answer.tokens_used <= 1500 and answer.phase == "start"


def test_a_session_stuck_on_a_compile_error_gets_the_fix_for_the_same_signature(world, workbench):
    ids, service = world
    stuck = workbench.compile_kernel("dot", SUM_BROKEN.replace("const float *x, float *out",
                                                               "const float *x, const float *y, float *out"))
    assert not stuck.ok
    answer = service.query_experience("it does not compile", session_id=stuck.session_id, token_budget=800)
    assert answer.phase == "compile_error"
    fixes = [i for i in answer.items if i.kind == "fix"]
    assert fixes and fixes[0].id == ids["broken"] and "same error signature" in fixes[0].why
    assert "## Errors and the fixes that resolved them" in answer.context
    # The line names the change that broke, not only the error it raised.
    assert f"{ACCUMULATOR_STRATEGY} failed with `" in answer.context
    assert answer.items[0].tier == "hot" and answer.items[0].kind == "target"


def test_an_error_pasted_on_a_task_of_another_family_gets_the_fix_recorded_with_the_same_signature(world):
    ids, service = world
    lesson = service.record_experience("declare the accumulator", "the running sum lost its declaration in the "
                                       "refactor; declare it before the loop", kernel_id=ids["broken"])
    # Another identifier, line and column, on an elementwise task: no words in common with the lesson.
    pasted = "gcc says:\nkernel.c:31:9: error: 'acc' undeclared (first use in this function)\nwhat now?"
    answer = service.query_experience(pasted, task_id="relu", token_budget=1200)
    assert answer.phase == "compile_error"
    by_id = {i.id: i for i in answer.items}
    assert ids["broken"] in by_id and by_id[ids["broken"]].kind == "fix"
    assert "same error signature" in by_id[ids["broken"]].why
    assert lesson.experience_id in by_id and "written about the same error" in by_id[lesson.experience_id].why
    # Without the pasted error the same question on that task offers no fix.
    plain = service.query_experience("what now?", task_id="relu", token_budget=1200)
    assert not any(i.kind == "fix" for i in plain.items)


def test_on_a_machine_with_no_history_wins_measured_elsewhere_are_offered_as_untested_here(world, workbench):
    ids, service = world
    here = workbench.store.attempt(ids["fast"]).hardware_key
    answer = service.query_experience("first run on this box: what is worth trying?", task_id="sum_reduce",
                                      hardware="x86_64/Some New CPU/96c/avx512f", token_budget=2000)
    # The win comes as its case or as the verified lesson on it (one of the two is kept: which ranks higher
    # depends on how tight the win's CI came out, so on the machine's load); either way as untested here.
    offered = [i for i in answer.items if i.id == ids["fast"] or
               (i.kind == "lesson" and i.verified and i.strategy == ACCUMULATOR_STRATEGY)]
    assert offered and all(i.tier == "cold" and i.label == "effective" for i in offered), answer.items
    for item in offered:
        said = answer.context[item.span[0]:item.span[1]]
        assert ("other hardware, untested here: effective" if item.kind == "case" else
                f"[measured on {here}, untested here: verified, effective") in said, said


def test_a_correct_but_slow_session_gets_the_best_measured_strategies(world, workbench):
    ids, service = world
    slow = workbench.compile_kernel("sum_reduce", workbench.tasks.get("sum_reduce").baseline_source)
    workbench.run_tests(slow.kernel_id)
    answer = service.query_experience("how do I go faster", session_id=slow.session_id)
    assert answer.phase == "optimize"
    cases = [i for i in answer.items if i.kind == "case"]
    # Ranked by label, downstream score and measurement confidence; which is first depends on how noisy the
    # short test measurements were, but the winning strategy must be offered.
    assert ids["fast"] in [c.id for c in cases]
    assert ACCUMULATOR_STRATEGY in answer.context


@pytest.mark.parametrize("budget", [1, 10, 40, 80, 150, 400, 2000])
def test_tokens_used_never_exceed_the_budget(world, budget):
    ids, service = world
    answer = service.query_experience("faster sum", session_id=ids["session"], token_budget=budget)
    assert answer.tokens_used <= budget


@pytest.mark.parametrize("budget", [60, 300, 2000])
def test_tokens_used_is_the_real_cl100k_count_of_the_context(world, budget):
    ids, service = world
    answer = service.query_experience("faster sum", session_id=ids["session"], token_budget=budget)
    assert answer.token_encoding == "cl100k_base"
    assert answer.tokens_used == count_tokens(answer.context) <= budget


def test_every_item_carries_its_data_and_where_its_text_lies_in_the_context(world):
    ids, service = world
    in_session = service.query_experience("faster sum", session_id=ids["session"], token_budget=4000)
    incumbent = next(i for i in in_session.items if i.kind == "incumbent")
    assert incumbent.id == ids["fast"] and incumbent.strategy == ACCUMULATOR_STRATEGY and incumbent.speedup
    answer = service.query_experience("faster sum", task_id="sum_reduce", phase="optimize", token_budget=4000)
    by_id = {i.id: i for i in answer.items}
    for item in answer.items + in_session.items:
        start, end = item.span
        context = (answer if item in answer.items else in_session).context
        assert 0 <= start < end <= len(context)
        assert context[start:end].startswith("- ") and context[start - 1] == "\n"  # a line of its own
    fast = by_id[ids["fast"]]
    assert fast.kind == "case" and fast.strategy == ACCUMULATOR_STRATEGY and fast.task_id == "sum_reduce"
    assert fast.family == "reduction" and fast.speedup and fast.step_ratio and fast.label and fast.hardware
    assert fast.flags == ["-O3"] and ids["fast"] in answer.context[slice(*fast.span)]
    wrong = by_id[ids["wrong"]]
    assert wrong.kind == "pitfall" and wrong.label == "incorrect" and wrong.strategy == "drop the tail loop"
    target = answer.items[0]
    assert target.kind == "target" and target.task_id == "sum_reduce" and target.hardware
    assert answer.context[slice(*target.span)].startswith("- Target: `sum_reduce`")


def test_a_fix_item_names_the_change_that_failed_and_the_one_that_fixed_it(world, workbench):
    ids, service = world
    stuck = workbench.compile_kernel("dot", SUM_BROKEN.replace("const float *x, float *out",
                                                               "const float *x, const float *y, float *out"))
    answer = service.query_experience("it does not compile", session_id=stuck.session_id, token_budget=800)
    fix = next(i for i in answer.items if i.kind == "fix")
    assert fix.strategy == ACCUMULATOR_STRATEGY and fix.label == "compile_error" and fix.error_signature
    assert fix.fix_id == ids["fast"] and fix.fix_strategy == ACCUMULATOR_STRATEGY


def test_the_fallback_estimate_never_counts_fewer_tokens_than_cl100k_on_real_contexts(world):
    ids, service = world
    texts = [service.history().context] + [
        service.query_experience(q, session_id=ids["session"], token_budget=b).context
        for q in ("faster sum", "it does not compile", "wrong results at the tail") for b in (200, 2000, 8000)]
    assert all(CalibratedCharCounter().count(t) >= count_tokens(t) for t in texts if t)


def test_the_history_lists_every_outcome_oldest_first_with_its_data_and_span(world):
    ids, service = world
    history = service.history()
    assert history.tokens == count_tokens(history.context) and history.token_encoding == "cl100k_base"
    by_id = {i.id: i for i in history.items}
    assert {ids["fast"], ids["wrong"], ids["broken"]} <= set(by_id)
    for item in history.items:
        assert history.context[item.span[0] - 1] == "\n" and history.context[slice(*item.span)].startswith("- ")
    assert by_id[ids["broken"]].label == "compile_error" and by_id[ids["fast"]].speedup


def test_the_history_is_chronological_with_each_lesson_right_after_its_attempt(world, workbench):
    ids, service = world
    history = service.history()
    order = [i.id for i in history.items]
    lessons = {i.id: i for i in history.items if i.kind == "lesson"}
    about_fast = [lid for lid in lessons if workbench.store.lesson(lid).attempt_id == ids["fast"]]
    assert about_fast, "the fixture records a lesson about the fast kernel"
    # Each lesson about an attempt comes after that attempt and before the next attempt made after it.
    position = order.index(ids["fast"])
    following = order[position + 1:]
    next_attempt = next((i for i in following if i not in lessons), None)
    block = following[:following.index(next_attempt)] if next_attempt else following
    assert set(about_fast) <= set(block)
    times = [workbench.store.attempt(i).created_at for i in order if i not in lessons]
    assert times == sorted(times)


def test_a_budget_below_the_hot_tier_returns_it_truncated_with_a_warning(world):
    ids, service = world
    answer = service.query_experience("faster sum", session_id=ids["session"], token_budget=10)
    assert all(i.tier == "hot" for i in answer.items)
    assert any("below the hot tier" in w for w in answer.warnings)


def test_a_very_long_query_is_cut_not_rejected(world):
    _, service = world
    answer = service.query_experience("sum " * 5000, task_id="sum_reduce")
    assert any("cut" in w for w in answer.warnings)


def test_without_embeddings_the_answer_says_semantic_search_was_off(world):
    _, service = world
    answer = service.query_experience("sum", task_id="sum_reduce")
    assert not answer.semantic_search and any("semantic search not available" in w for w in answer.warnings)


def test_unknown_ids_and_empty_lessons_are_refused(world):
    _, service = world
    with pytest.raises(UnknownKernelError):
        service.record_experience("x", "y", kernel_id="k-nope")
    with pytest.raises(UnknownSessionError):
        service.query_experience("x", session_id="s-nope")
    with pytest.raises(UnknownTaskError):
        service.query_experience("x", task_id="nope")
    with pytest.raises(EmptyLessonError):
        service.record_experience("x", "   ")


def test_export_then_import_into_an_empty_home_gives_the_same_graph_and_answers(world, workbench, tmp_path):
    ids, service = world
    path = tmp_path / "memory.jsonl"
    counts = export_memory(workbench.memory, path, seal=HOME_1)
    fresh = Workbench(make_settings(tmp_path / "fresh-home"), workbench.tasks)
    report = import_memory(fresh.memory, path, seal=HOME_1)  # a backup restored: the home's own again
    assert fresh.store.counts() == counts and report.origin == "" and not report.edited
    assert report.added["attempt"] == counts["Attempt"]
    again = import_memory(fresh.memory, path, seal=HOME_1)
    assert not again.added and fresh.store.counts() == counts
    fresh_service = ExperienceService(fresh.memory, fresh.tasks)
    for kwargs in ({"task_id": "dot"}, {"session_id": ids["session"]}):
        before = service.query_experience("faster reduction", **kwargs)
        after = fresh_service.query_experience("faster reduction", **kwargs)
        assert after.context == before.context


def test_the_read_index_kept_by_writes_and_one_rebuilt_from_the_graph_give_the_store_scans_answers(world, workbench):
    ids, service = world
    assert workbench.memory.index.complete  # kept by every write since the home was empty
    scanning = ExperienceMemory(workbench.store, BackgroundEmbedder(enabled=False), index=ReadIndex(None))
    rebuilt = ExperienceMemory(workbench.store, BackgroundEmbedder(enabled=False), index=ReadIndex(None))
    assert not scanning.index.complete and not rebuilt.index.complete
    rebuilt.load_index()
    assert rebuilt.index.complete
    for kwargs in ({"task_id": "dot"}, {"task_id": "sum_reduce", "phase": "optimize"},
                   {"session_id": ids["session"]}, {"task_id": "softmax"}):
        # While the index is rebuilt no lesson is found by its words (the index holds the lesson search): a
        # question that matches none gets the same answer from the scans
        expected = ExperienceService(scanning, workbench.tasks).query_experience("qwzx", **kwargs).context
        assert service.query_experience("qwzx", **kwargs).context == expected
        kept = service.query_experience("faster", **kwargs).context
        assert ExperienceService(rebuilt, workbench.tasks).query_experience("faster", **kwargs).context == kept


def test_import_merges_into_a_memory_with_its_own_experience_and_serves_it_as_cross_hardware_evidence(
        world, workbench, tmp_path):
    path = tmp_path / "memory.jsonl"
    exported = export_memory(workbench.memory, path)
    other = Workbench(make_settings(tmp_path / "other-home"), workbench.tasks)
    own = other.compile_kernel("vector_add", VECTOR_ADD_OK, strategy="plain loop")
    other.run_tests(own.kernel_id)
    before = other.store.counts()
    import_memory(other.memory, path)
    merged = other.store.counts()
    assert merged["Attempt"] == before["Attempt"] + exported["Attempt"]
    import_memory(other.memory, path)
    assert other.store.counts() == merged  # same attempts, same ids: no duplicates
    source_hardware = set(workbench.store.hardware_keys())
    assert source_hardware <= set(other.store.hardware_keys())
    # On a machine the imported experience was not measured on, it is still offered, marked as such.
    answer = ExperienceService(other.memory, other.tasks).query_experience(
        "faster reduction", task_id="dot", hardware="another-chip-x86-64-avx2-8c")
    imported = [i for i in answer.items if i.tier == "cold"]
    # Each says where it comes from (a general lesson has no hardware to differ by; it is still an import).
    assert imported and all("other hardware" in i.why or "imported from another home" in i.why for i in imported)
    assert any("other hardware" in i.why for i in imported)


def test_a_suspect_measurement_is_never_offered_as_what_worked(world, workbench):
    ids, service = world
    before = service.query_experience("accumulators", task_id="sum_reduce", phase="optimize", token_budget=4000)
    assert ids["fast"] in {i.id for i in before.items if i.kind == "case"}
    workbench.memory._update(ids["fast"], suspect=True, suspect_reason="the speedup's 95% CI contains 1")
    try:
        after = service.query_experience("accumulators", task_id="sum_reduce", phase="optimize", token_budget=4000)
        assert ids["fast"] not in {i.id for i in after.items if i.kind == "case"}
        lesson = service.record_experience(ACCUMULATOR_STRATEGY, "it was much faster", kernel_id=ids["fast"])
        assert not lesson.verified and lesson.label == "lesson"
    finally:
        workbench.memory._update(ids["fast"], suspect=False, suspect_reason="")


def test_an_import_from_another_home_is_evidence_from_there_never_a_win_here(world, workbench, tmp_path):
    ids, _ = world
    path = tmp_path / "memory.jsonl"
    export_memory(workbench.memory, path, seal=HOME_A)
    # In transit, one attempt is made a 55x win: its line no longer matches its hash.
    make_a_win(path, ids["naive"], rehash=False)
    other = Workbench(make_settings(tmp_path / "home-b"), workbench.tasks)
    report = import_memory(other.memory, path, seal=HOME_B)
    assert report.origin.startswith("home home-a, exported ") and report.edited == {"attempt": 1}
    edited = other.store.attempt(ids["naive"])  # kept for its successors, but never taught from
    assert edited.suspect and "sha256" in edited.suspect_reason and not edited.teaches
    fast = other.store.attempt(ids["fast"])
    assert fast.origin == report.origin and fast.label == workbench.store.attempt(ids["fast"]).label
    assert all(not lesson.verified and lesson.origin for lesson in other.store.lessons_for_attempt(ids["fast"]))
    # Same task, same hardware key as where it was measured: still evidence from elsewhere, never a win here.
    answer = ExperienceService(other.memory, other.tasks).query_experience(
        "accumulators", task_id="sum_reduce", phase="optimize", token_budget=4000)
    imported = [item for item in answer.items if item.origin]
    assert imported and all(item.tier == "cold" for item in imported)
    assert not any(item.tier == "warm" and item.kind == "case" for item in answer.items)
    assert "imported from home home-a" in answer.context and ids["naive"] not in answer.context
    served = next(item for item in answer.items if item.id == ids["fast"])
    assert "untested here" in answer.context[served.span[0]:served.span[1]]
    # A lesson written here on the imported attempt is not verified by a measurement made there.
    said = ExperienceService(other.memory, other.tasks).record_experience(
        ACCUMULATOR_STRATEGY, "accumulators helped", kernel_id=ids["fast"])
    assert not said.verified and not said.measured


def test_an_edited_and_re_hashed_copy_of_this_homes_export_is_an_import_counted_edited(world, workbench, tmp_path):
    ids, _ = world
    path = tmp_path / "memory.jsonl"
    export_memory(workbench.memory, path, seal=HOME_1)
    # The unkeyed hash recomputed after the edit: it matches, but the home's key proves nothing of the line.
    make_a_win(path, ids["naive"], rehash=True)
    restored = Workbench(make_settings(tmp_path / "restored"), workbench.tasks)
    report = import_memory(restored.memory, path, seal=HOME_1)
    assert report.edited == {"attempt": 1} and report.origin.startswith("a copy of this home's export")
    forged = restored.store.attempt(ids["naive"])
    assert forged.suspect and not forged.teaches and forged.origin
    assert not restored.store.attempt(ids["fast"]).origin  # every other line is proven: this home's own


def test_a_file_that_copies_this_homes_id_without_its_key_is_an_import(world, workbench, tmp_path):
    path = tmp_path / "memory.jsonl"
    export_memory(workbench.memory, path, seal=HomeSeal("home-1", b"another key altogether".ljust(32, b".")))
    other = Workbench(make_settings(tmp_path / "other"), workbench.tasks)
    report = import_memory(other.memory, path, seal=HOME_1)
    assert report.origin and report.edited  # it claims to be this home's signed export, and proves none of it
    assert all(a.origin for a in other.memory.all_attempts())
    assert not any(lesson.verified for lesson in other.memory.all_lessons())
