"""compile_kernel, run_tests and profile_kernel record their outcomes in the graph as they happen."""

import pytest

from kope_mcp.memory.outcome import label_for
from kope_mcp.memory.records import AgentInfo
from tests.memory_helpers import SUM_BROKEN, run_sum_session


@pytest.fixture(scope="module")
def session(workbench):
    return run_sum_session(workbench, agent=AgentInfo(name="claude-desktop", version="1.2.3"))


def test_every_attempt_is_recorded_with_its_outcome(workbench, session):
    store = workbench.store
    assert store.attempt(session["broken"]).label == "compile_error"
    assert store.attempt(session["broken"]).error_signature.startswith("compile: ")
    wrong = store.attempt(session["wrong"])
    assert wrong.label == "incorrect" and wrong.error_signature == "test:mismatch:values"
    fast = store.attempt(session["fast"])
    assert fast.correct and fast.speedup > 0 and fast.median_s > 0 and 0 < fast.confidence <= 1


def test_prev_comes_from_parent_id_else_the_previous_attempt(workbench, session):
    store = workbench.store
    assert store.attempt(session["broken"]).parent_id == session["naive"]  # previous attempt of the session
    assert store.attempt(session["fast"]).parent_id == session["naive"]  # explicit parent_id
    assert {a.kernel_id for a in store.successors(session["naive"])} == {session["broken"], session["fast"]}


def test_step_ratio_label_and_downstream_follow_the_measurements(workbench, session):
    store = workbench.store
    naive, fast = store.attempt(session["naive"]), store.attempt(session["fast"])
    assert naive.step_ratio == pytest.approx(naive.speedup)  # a root is measured against the naive baseline
    # A suspect parent (the baseline's own code is) is no base: the step is then measured from the naive baseline.
    base = 1.0 if naive.suspect else naive.speedup
    assert fast.step_ratio == pytest.approx(fast.speedup / base)
    # Labels come from the interval: the speedup's CI over the predecessor's speedup.
    fast_interval = (fast.speedup_ci_low / base, fast.speedup_ci_high / base)
    assert fast.label == label_for(True, True, fast.step_ratio, fast_interval)
    if "the baseline's own code" in naive.suspect_reason:
        assert naive.label == "ineffective"  # the baseline's own code: placement or noise, whatever was measured
    else:
        assert naive.label == label_for(True, True, naive.step_ratio, (naive.speedup_ci_low, naive.speedup_ci_high))
    children = store.successors(session["naive"])
    assert naive.downstream == pytest.approx(0.5 * naive.step_ratio + 0.35 * sum(c.downstream for c in children))


def test_the_incumbent_is_the_best_correct_attempt(workbench, session):
    rec = workbench.store.session(session["session"])
    best = max((workbench.store.attempt(session[k]) for k in ("naive", "fast")), key=lambda a: a.speedup)
    assert rec.incumbent_id in (session["naive"], session["fast"])
    assert rec.incumbent_speedup <= best.speedup
    assert rec.incumbent_id != session["wrong"]


def test_the_memory_s_cached_session_agrees_with_the_store_after_every_step(workbench, session):
    # compile_kernel reads sessions from the memory's cache: the incumbent must be the stored one.
    assert workbench.memory.session(session["session"]) == workbench.store.session(session["session"])


def test_a_new_attempt_s_diff_comes_from_its_parent_s_source_whether_cached_or_read(workbench, session):
    source = workbench.store.sources([session["fast"]])[session["fast"]]
    first = workbench.compile_kernel("sum_reduce", source + "\n// zero\n")
    # The parent is the session's latest attempt, whose source the memory still holds.
    cached = workbench.compile_kernel("sum_reduce", source + "\n// zero\n// one\n", session_id=first.session_id)
    workbench.memory.forget_cached()
    read = workbench.compile_kernel("sum_reduce", source + "\n// zero\n// one\n// two\n",
                                    session_id=first.session_id)
    diffs = [workbench.store.attempt(r.kernel_id).diff_from_parent for r in (cached, read)]
    assert [d.strip() for d in diffs] == ["+ // one", "+ // two"]


def test_the_client_that_produced_the_session_is_recorded(workbench, session):
    assert workbench.store.session(session["session"]).agent == AgentInfo(name="claude-desktop", version="1.2.3")
    assert workbench.store.attempt(session["naive"]).agent == "claude-desktop 1.2.3"


def test_the_same_error_in_another_session_gets_the_same_signature(workbench, session):
    other = workbench.compile_kernel("sum_reduce", SUM_BROKEN.replace("acc[k]", "acc[k] ").replace("total", "sum"))
    assert workbench.store.attempt(other.kernel_id).error_signature == \
        workbench.store.attempt(session["broken"]).error_signature


def test_the_change_from_the_parent_is_recorded_as_a_short_diff(workbench, session):
    fast = workbench.store.attempt(session["fast"])
    assert "+ float acc[16] = {0};" in fast.diff_from_parent
    assert "- float acc = 0.0f;" in fast.diff_from_parent
    assert workbench.store.attempt(session["naive"]).diff_from_parent == ""  # a root has no parent


def test_concurrent_recording_from_many_threads_loses_nothing(workbench):
    from concurrent.futures import ThreadPoolExecutor

    from kope_mcp.experience.service import ExperienceService
    from tests.memory_helpers import SUM_NAIVE

    service = ExperienceService(workbench.memory, workbench.tasks)
    before = workbench.store.counts()

    def work(i: int) -> tuple[str, str]:
        compiled = workbench.compile_kernel("sum_reduce", SUM_NAIVE + f"// variant {i % 3}\n", strategy=f"s{i % 4}")
        lesson = service.record_experience(f"s{i % 4}", f"lesson {i}", kernel_id=compiled.kernel_id)
        return compiled.kernel_id, lesson.experience_id

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, range(24)))
    after = workbench.store.counts()
    assert after["Attempt"] - before["Attempt"] == 24 and after["Lesson"] - before["Lesson"] == 24
    for kernel_id, lesson_id in results:
        assert workbench.store.lesson(lesson_id).attempt_id == kernel_id


def test_building_on_another_clients_attempt_starts_the_callers_own_session_with_the_lineage_kept(workbench):
    a, b = AgentInfo(name="client-a", version="1"), AgentInfo(name="client-b", version="1")
    source = workbench.tasks.get("vector_add").baseline_source
    first = workbench.compile_kernel("vector_add", source + "\n// a\n", agent=a)
    again = workbench.compile_kernel("vector_add", source + "\n// a2\n", parent_id=first.kernel_id, agent=a,
                                     session_id=first.session_id)
    built = workbench.compile_kernel("vector_add", source + "\n// b\n", parent_id=first.kernel_id, agent=b)
    # The same client name and version, without the session's id: a copied clientInfo proves nothing.
    copied = workbench.compile_kernel("vector_add", source + "\n// c\n", parent_id=first.kernel_id, agent=a)
    assert again.session_id == first.session_id  # the holder of the session's id: the same session
    assert built.session_id != first.session_id and copied.session_id not in (first.session_id, built.session_id)
    assert workbench.store.attempt(built.kernel_id).parent_id == first.kernel_id
    assert workbench.memory.session(built.session_id).agent.display == "client-b 1"
