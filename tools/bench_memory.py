#!/usr/bin/env python3
"""Experience-memory benchmark: fill a real Kùzu memory with N synthetic attempts and print record and query
latency percentiles, RSS and database size, with a numpy brute-force top-k over the same vectors measured in the
same run as the side-by-side reference.

    python tools/bench_memory.py                 # N = 1000, 10000, 100000
    python tools/bench_memory.py --sizes 10000 --queries 300

The fill is bulk-loaded (UNWIND for nodes, COPY for edges and vectors). Its embeddings are random unit vectors
(embedding 100k texts with the model would take ~50 min here); the query embedding is computed by the real
model on every query, so query latency includes it. Recording is measured through the same code the tools use
(ExperienceMemory.record_compile / record_test and ExperienceService.record_experience).
Targets on a 2-core machine: query p50 < 50 ms and p95 < 150 ms at 10k, p50 < 100 ms at 100k; record p50 < 20 ms.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from kope_mcp.experience.service import ExperienceService
from kope_mcp.hardware import detect_hardware
from kope_mcp.memory.embedder import MODEL_NAME, BackgroundEmbedder
from kope_mcp.memory.experience_memory import ExperienceMemory
from kope_mcp.memory.outcome import label_for
from kope_mcp.memory.records import AgentInfo, AttemptRecord, LessonRecord, SessionRecord, StrategyRecord
from kope_mcp.memory.schema import EMBEDDING_DIM
from kope_mcp.memory.store import KuzuExperienceStore
from kope_mcp.memory.strategies import strategy_key
from kope_mcp.models import TestReport
from kope_mcp.tasks.registry import TaskRegistry

STRATEGIES = [
    "OpenMP over rows", "unroll by 4", "unroll by 8", "AVX2 intrinsics", "AVX-512 intrinsics", "blocking 32",
    "blocking 64", "blocking 128", "multiple accumulators", "restrict pointers", "loop interchange",
    "software prefetch", "fused multiply-add", "-ffast-math", "-O3 -march=native", "transpose B first",
    "register tiling 4x4", "vectorised expf", "two-pass to one-pass", "Welford variance", "tree reduction",
    "block scan then fix-up", "cache-oblivious recursion", "aligned loads", "non-temporal stores",
]
ERRORS = ["compile: 'X' undeclared (first use in this function)", "compile: expected ';' before 'X' token",
          "compile: incompatible type for argument N of 'X'", "test:mismatch:unwritten", "test:crash:SIGSEGV",
          "test:mismatch:values", "test:nan"]
_BODY = "    for (int64_t i = 0; i < n; i++) y[i] = x[i] * 2.0f; /* a line of a ~1 KB kernel */\n" * 11


def source(i: int) -> str:
    return "#include <stdint.h>\nvoid kernel(const float *x, float *y, int64_t n) {\n" + _BODY + f"}} /* {i} */\n"


def percentiles(values: list[float]) -> str:
    ms = np.asarray(values) * 1e3
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return f"p50 {p50:7.2f} ms  p95 {p95:7.2f} ms  p99 {p99:7.2f} ms  (n={len(ms)})"


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def fill(store: KuzuExperienceStore, n: int, registry: TaskRegistry, rng: random.Random) -> list[str]:
    tasks = registry.list()
    hw_keys = [detect_hardware().key, "aarch64/Neoverse-V2/72c/sve2"]
    for task in tasks:
        store.upsert_task(task.id, task.spec.family, task.spec.level, task.spec.summary)
    store.upsert_hardware(hw_keys[0], "x86_64", "here", 2, [], [])
    store.upsert_hardware(hw_keys[1], "aarch64", "Neoverse V2", 72, ["sve2"], [])
    strategies = [StrategyRecord(strategy_id=f"st-{i:04d}", name=name, key=strategy_key(name))
                  for i, name in enumerate(STRATEGIES)]
    for strategy in strategies:
        store.add_strategy(strategy)
    sessions, attempts, lessons = [], [], []
    for s in range(max(1, n // 10)):
        task = rng.choice(tasks)
        hw = hw_keys[0] if rng.random() < 0.8 else hw_keys[1]
        sessions.append(SessionRecord(session_id=f"s-{s:08d}", task_id=task.id, hardware_key=hw,
                                      agent=AgentInfo(name="bench"), created_at=f"2026-01-01T00:00:{s:08d}"))
        parent, parent_speedup = None, 1.0
        for k in range(10):
            i = s * 10 + k
            if i >= n:
                break
            strategy = rng.choice(strategies)
            ok = rng.random() > 0.15
            correct = ok and rng.random() > 0.2
            speedup = parent_speedup * rng.uniform(0.6, 2.0) if correct else None
            ratio = speedup / parent_speedup if speedup else None
            signature = None if correct else rng.choice(ERRORS[:3] if not ok else ERRORS[3:])
            attempts.append(AttemptRecord(
                kernel_id=f"k-{i:010d}", session_id=sessions[-1].session_id, task_id=task.id,
                family=task.spec.family, hardware_key=hw, target="c", build_hash="b", source=source(i),
                source_hash=f"{i}", flags=["-O3"], ok=ok, parent_id=parent,
                strategy=strategy.name, strategy_id=strategy.strategy_id, created_at=f"2026-01-01T00:{i:010d}",
                agent="bench", error_signature=signature, tested=ok, correct=correct if ok else None,
                speedup=speedup, step_ratio=ratio, label=label_for(ok, correct if ok else None, ratio),
                confidence=rng.uniform(0.5, 1.0) if speedup else 0.0, downstream=rng.uniform(0, 2),
            ))
            if correct:
                parent, parent_speedup = attempts[-1].kernel_id, speedup or 1.0
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    store.bulk_sessions(sessions)
    phases["sessions"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.bulk_attempts(attempts)
    phases["attempts"] = time.perf_counter() - t0
    for j, attempt in enumerate(attempts[:: 10]):
        lessons.append((LessonRecord(
            lesson_id=f"x-{j:010d}", text=f"{attempt.strategy} on {attempt.task_id}: {attempt.label}",
            strategy=attempt.strategy or "", strategy_id=attempt.strategy_id, task_id=attempt.task_id,
            family=attempt.family, hardware_key=attempt.hardware_key, attempt_id=attempt.kernel_id, verified=True,
            label=attempt.label, confidence=0.8, created_at=attempt.created_at),
            f"{attempt.strategy} {attempt.task_id}"))
    t0 = time.perf_counter()
    store.bulk_lessons(lessons)
    phases["lessons"] = time.perf_counter() - t0
    vectors = np.random.default_rng(0).standard_normal((len(attempts) + len(lessons), EMBEDDING_DIM))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [(a.kernel_id, "attempt") for a in attempts] + [(lsn.lesson_id, "lesson") for lsn, _ in lessons]
    t0 = time.perf_counter()
    store.bulk_embeddings([(i, kind, MODEL_NAME, v.tolist()) for (i, kind), v in zip(ids, vectors, strict=True)])
    phases["embeddings"] = time.perf_counter() - t0
    print("fill phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()), flush=True)
    return [s.session_id for s in sessions]


def run(n: int, queries: int, records: int, embedder: BackgroundEmbedder, registry: TaskRegistry) -> None:
    rng = random.Random(n)
    home = Path(tempfile.mkdtemp(prefix=f"kope-bench-mem-{n}-"))
    try:
        store = KuzuExperienceStore(home / "memory.kuzu")
        t0 = time.perf_counter()
        session_ids = fill(store, n, registry, rng)
        fill_s = time.perf_counter() - t0
        memory = ExperienceMemory(store, embedder)
        t0 = time.perf_counter()
        memory.start()
        memory.drain(600)
        memory.wait_index(600)  # filled behind its back: the read index is rebuilt from the graph at the start
        load_s = time.perf_counter() - t0
        service = ExperienceService(memory, registry)
        tasks = registry.list()

        record_compile, record_test, record_lesson = [], [], []
        for i in range(records):
            session = store.session(rng.choice(session_ids))
            task = registry.get(session.task_id)
            attempt = AttemptRecord(
                kernel_id=f"k-new-{i:06d}", session_id=session.session_id, task_id=task.id, family=task.spec.family,
                hardware_key=session.hardware_key, target="c", build_hash="b", source=source(i),
                source_hash="h",
                flags=["-O2"], ok=True, strategy=rng.choice(STRATEGIES), created_at=f"2027-{i:06d}")
            t0 = time.perf_counter()
            memory.record_compile(attempt, None)
            record_compile.append(time.perf_counter() - t0)
            report = TestReport(kernel_id=attempt.kernel_id, task_id=task.id, passed=False, failure="mismatch",
                                message="1 of 5 cases failed", cases=[], seeds_per_case=2, next_step="")
            t0 = time.perf_counter()
            memory.record_test(attempt.kernel_id, report)
            record_test.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            service.record_experience(rng.choice(STRATEGIES), f"lesson {i} about {task.id}",
                                      kernel_id=attempt.kernel_id)
            record_lesson.append(time.perf_counter() - t0)

        query_times, brute_times, budgets_ok = [], [], 0
        for i in range(queries):
            kind = i % 3
            t0 = time.perf_counter()
            if kind == 0:
                answer = service.query_experience("make it faster with better cache use", task_id=rng.choice(tasks).id)
            elif kind == 1:
                answer = service.query_experience("fix the error", session_id=rng.choice(session_ids),
                                                  token_budget=1000)
            else:
                answer = service.query_experience("vectorise the inner loop", session_id=rng.choice(session_ids),
                                                  phase="optimize")
            query_times.append(time.perf_counter() - t0)
            budgets_ok += answer.tokens_used <= answer.token_budget
            q = np.random.default_rng(i).standard_normal(EMBEDDING_DIM).astype(np.float32)
            q /= np.linalg.norm(q)
            t0 = time.perf_counter()
            matrix_search(memory, q)
            brute_times.append(time.perf_counter() - t0)
        embed_times = []
        for i in range(50):
            t0 = time.perf_counter()
            embedder.embed([f"query number {i} about blocking"])
            embed_times.append(time.perf_counter() - t0)
        size = sum(p.stat().st_size for p in home.glob("memory.kuzu*"))
        print(f"\n== N = {n} attempts ({store.counts()['Lesson']} lessons, {len(memory.vectors)} vectors) ==")
        print(f"fill (bulk) {fill_s:.1f} s; start + load vectors {load_s:.1f} s; RSS {rss_mib():.0f} MiB; "
              f"database {size / 2**20:.1f} MiB")
        print(f"record_compile     {percentiles(record_compile)}")
        print(f"record_test        {percentiles(record_test)}")
        print(f"record_experience  {percentiles(record_lesson)}")
        print(f"query_experience   {percentiles(query_times)}   budget respected {budgets_ok}/{queries}")
        print(f"  of which: query embedding {percentiles(embed_times)}")
        print(f"numpy brute top-50 {percentiles(brute_times)}   (same vectors, side by side)")
        print(f"semantic search: {memory.semantic_status}")
        memory.stop()
        store.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def matrix_search(memory: ExperienceMemory, query: np.ndarray) -> list[tuple[str, str, float]]:
    return memory.vectors.search(query.tolist(), 50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--records", type=int, default=200)
    args = parser.parse_args()
    registry = TaskRegistry.default()
    embedder = BackgroundEmbedder(enabled=True)
    embedder.start()
    if not embedder.wait(300):
        raise SystemExit(f"the embedding model did not load: {embedder.status}")
    print(f"model: {embedder.status}; machine: {detect_hardware().key}")
    for n in args.sizes:
        run(n, args.queries, args.records, embedder, registry)


if __name__ == "__main__":
    main()
