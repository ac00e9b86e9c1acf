#!/usr/bin/env python3
"""Retrieval quality and speed of query_experience on a team-sized memory with ground truth.

    python tools/bench_retrieval.py                              # 2k and 10k lessons, embeddings off and on
    python tools/bench_retrieval.py --sizes 50000 --embeddings off
    python tools/bench_retrieval.py --sizes 2000 --order "newest first" "oldest first" shuffled
    python tools/bench_retrieval.py --size 1000000                # a million lessons: every figure in one run
    python tools/bench_retrieval.py --size 1000000 --attempts 1000000   # and a million attempts beside them

For each size: a corpus is generated (kope_mcp/bench/retrieval_corpus.py: wins, pitfalls and compile-error fixes
on four kinds of hardware, buried in hard noise), imported once by `kope memory import` (timed), asked without
embeddings, embedded as a server's backlog does (timed, items/s), then asked with them; every query is asked
through the SDK's in-process MCP client with its task_id, hardware and a 2,000-token budget. Printed per size,
order and embeddings setting, overall and per kind of question:
- hit rate: a relevant item is in the context;
- recall: the share of the relevant items in the context;
- violations: a must-not item (a win on the other kind of hardware) ranked first;
- tokens: the context's estimated tokens, median;
- p50 / p95 / max latency of the tool call, and the load average;
and per memory: the import's time and peak memory (`kope memory import` in its own process), the graph's, read
index's and vector file's sizes on disk, the first question's time after the server's start (its start included),
how much the serving process's resident memory grew (its own, and mapped files), the embedding backlog's rate.
Targets (issue 16): hit >= 90% overall and >= 80% per kind, recall >= 0.8, no violation; p50 <= 50 ms and
p95 <= 100 ms at 10k with embeddings on, p95 <= 150 ms at 50k.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio

from kope_mcp.bench.retrieval_corpus import CORPUS_HOME, Corpus, Query, generate, kinds
from kope_mcp.memory.admin import home_seal


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def load(corpus: Corpus, home: Path, order: str) -> dict[str, Any]:
    path = home.parent / f"{home.name}.jsonl"
    # Imported by `kope memory import` itself (its own process: its peak memory is its own), as this home's own
    # export, signed with its key: the corpus's lessons are the home's measurements, not evidence from elsewhere.
    home.mkdir(mode=0o700, parents=True)
    (home / "home-id").write_text(CORPUS_HOME + "\n")
    corpus.write(path, order, seal=home_seal(home))
    env = {**os.environ, "KOPE_HOME": str(home), "KOPE_EMBEDDINGS": "off"}
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "kope_mcp", "memory", "import", str(path)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    figures: dict[str, Any] = {"import_s": time.perf_counter() - t0, "import_peak_mb": usage.ru_maxrss / 1024}
    if status != 0:
        raise SystemExit(f"kope memory import failed: {child.stderr.read().decode()[-2000:] if child.stderr else ''}")
    path.unlink()
    return figures | disk(home)


def embed(home: Path) -> dict[str, Any]:
    """The embedding backlog of an imported home, as a server runs it (one worker per core), timed from a loaded
    model; identical texts are embedded once."""
    from kope_mcp.services.workbench import Workbench
    from kope_mcp.settings import KopeSettings

    bench = Workbench(KopeSettings.from_env(home=home, embeddings=True))
    bench.memory.start()
    bench.memory.embedder.wait(timeout=600)  # the backlog's rate from a loaded model, not with its start-up
    t0 = time.perf_counter()
    bench.memory.drain(timeout=4 * 3600)
    figures = {"embed_s": time.perf_counter() - t0, "embedded": len(bench.memory.vectors),
               "runtime": bench.memory.embedder.runtime}
    bench.memory.stop()
    bench.memory.close()
    return figures | disk(home)


def disk(home: Path) -> dict[str, float]:
    """Megabytes on disk: the graph (database and log), the read index, the vector file."""
    def mb(pattern: str) -> float:
        return sum(f.stat().st_size for f in home.glob(pattern)) / 1024**2
    return {"graph_mb": mb("memory.kuzu") + mb("memory.kuzu.wal"), "index_mb": mb("memory.kuzu.index*"),
            "vectors_mb": mb("memory.kuzu.vectors")}


def memory_mb() -> dict[str, float]:
    """This process's resident memory now: anonymous (its own) and file-backed (mapped files, the page cache's)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {name: int(fields[name].split()[0]) / 1024 for name in ("RssAnon", "RssFile") if name in fields}


async def ask(corpus: Corpus, home: Path, embeddings: bool, budget: int, selection: str) -> list[dict[str, Any]]:
    from mcp import Client

    from kope_mcp.app.server import build_server
    from kope_mcp.settings import KopeSettings

    results = []
    settings = KopeSettings.from_env(home=home, embeddings=embeddings, selection=selection)
    before = memory_mb()
    t0 = time.perf_counter()
    async with Client(build_server(settings)) as client:
        # The first question after the server starts (its start included), as the first agent of the day sees it.
        await _query(client, corpus.queries[-1], budget)
        results.append({"first_query_s": time.perf_counter() - t0})
        if embeddings:  # the server loads the stored vectors in the background: wait until it searches by them
            with anyio.fail_after(3600):
                while not (await _query(client, corpus.queries[0], budget))[0]["semantic_search"]:
                    await anyio.sleep(0.2)
        for query in corpus.queries:
            result, seconds = await _query(client, query, budget)
            returned = [item["id"] for item in result["items"] if item["tier"] != "hot"]
            results.append({"query": query, "returned": returned, "seconds": seconds,
                            "tokens": result["tokens_used"]})
        after = memory_mb()
    results[0]["serving_mb"] = {k: after[k] - before.get(k, 0.0) for k in after}
    return results


async def _query(client: Any, query: Query, budget: int) -> tuple[dict[str, Any], float]:
    args = {"query": query.text, "task_id": query.task_id, "hardware": query.hardware, "token_budget": budget}
    if query.phase:
        args["phase"] = query.phase
    t0 = time.perf_counter()
    result = await client.call_tool("query_experience", args)
    seconds = time.perf_counter() - t0
    assert not result.is_error, result.content
    return result.structured_content, seconds


def score(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results[1:]:
        groups["all"].append(r)
        groups[r["query"].kind].append(r)
    table = {}
    for name, rows in groups.items():
        hits = [bool(set(r["returned"]) & r["query"].relevant) for r in rows]
        recall = [len(set(r["returned"]) & r["query"].relevant) / len(r["query"].relevant) for r in rows]
        violations = sum(1 for r in rows if r["returned"] and r["returned"][0] in r["query"].must_not_lead)
        seconds = [r["seconds"] for r in rows]
        table[name] = {"n": len(rows), "hit": sum(hits) / len(rows), "recall": statistics.mean(recall),
                       "violations": violations, "tokens": statistics.median(r["tokens"] for r in rows),
                       "p50_ms": statistics.median(seconds) * 1e3, "p95_ms": percentile(seconds, 0.95) * 1e3,
                       "max_ms": max(seconds) * 1e3}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", "--size", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--embeddings", choices=("off", "on", "both"), default="both")
    parser.add_argument("--order", nargs="+", default=["as generated"],
                        choices=("as generated", "newest first", "oldest first", "shuffled"))
    parser.add_argument("--budget", type=int, default=2000)
    parser.add_argument("--selection", nargs="+", default=["evidence"],
                        help="selection configs to compare: preset names (evidence, recency, text) or JSON files "
                             "of SelectionConfig fields (as KOPE_SELECTION takes)")
    parser.add_argument("--misses", action="store_true", help="list each query that found nothing relevant")
    parser.add_argument("--attempts", type=int, default=0,
                        help="attempts added as noise (sessions of compiles and tests, nothing measured; ~1.7 KB of "
                             "source each): a memory of lessons and attempts")
    args = parser.parse_args()
    for size in args.sizes:
        corpus = generate(size, attempts=args.attempts)
        distinct = len({lesson.get("search_text") or lesson["text"] for lesson in corpus.lessons})
        print(f"\n## {len(corpus.lessons)} lessons ({distinct} distinct texts), {len(corpus.attempts)} attempts, "
              f"{len(corpus.queries)} queries "
              f"({', '.join(f'{k} {sum(q.kind == k for q in corpus.queries)}' for k in kinds(corpus.queries))})",
              flush=True)
        for order in args.order:
            # One import per order; the questions without embeddings first, then the backlog, then with them.
            home = Path(tempfile.mkdtemp(prefix="kope-bench-retrieval-")) / "home"
            figures = load(corpus, home, order)
            for embeddings in {"off": [False], "on": [True], "both": [False, True]}[args.embeddings]:
                if embeddings:
                    figures |= embed(home)
                for selection in args.selection:
                    report(corpus, home, order, embeddings, selection, figures, args)
            shutil.rmtree(home.parent, ignore_errors=True)


def report(corpus: Corpus, home: Path, order: str, embeddings: bool, selection: str, figures: dict[str, Any],
           args: argparse.Namespace) -> None:
    results = anyio.run(ask, corpus, home, embeddings, args.budget, selection)
    load1 = os.getloadavg()[0]
    serving = results[0]["serving_mb"]
    imported = (f"import {figures['import_s']:.1f} s ({len(corpus.lessons) / figures['import_s']:.0f}/s, peak "
                f"{figures['import_peak_mb']:.0f} MB); on disk: graph {figures['graph_mb']:.0f} MB, read index "
                f"{figures['index_mb']:.0f} MB, vectors {figures['vectors_mb']:.0f} MB; first query "
                f"{results[0]['first_query_s']:.2f} s after the server's start; the server's resident memory grew "
                f"{serving.get('RssAnon', 0):.0f} MB (own) + {serving.get('RssFile', 0):.0f} MB (mapped files)")
    embedded = (f", embedding backlog {figures['embedded']:.0f} items in {figures['embed_s']:.1f} s "
                f"({figures['embedded'] / max(figures['embed_s'], 1e-9):.0f}/s, {figures['runtime']})"
                if embeddings else "")
    print(f"\n{order}, embeddings {'on' if embeddings else 'off'}, selection {selection}: "
          f"{imported}{embedded}; load average {load1:.2f}", flush=True)
    print(f"{'kind':<22} {'n':>3} {'hit':>6} {'recall':>7} {'viol':>5} {'tokens':>7} "
          f"{'p50 ms':>7} {'p95 ms':>7} {'max ms':>7}")
    for name, row in score(results).items():
        print(f"{name:<22} {row['n']:>3} {row['hit']:>6.0%} {row['recall']:>7.2f} "
              f"{row['violations']:>5} {row['tokens']:>7.0f} {row['p50_ms']:>7.1f} {row['p95_ms']:>7.1f} "
              f"{row['max_ms']:>7.1f}")
    if args.misses:
        for r in results[1:]:
            if not set(r["returned"]) & r["query"].relevant:
                q = r["query"]
                print(f"  miss {q.qid} {q.kind}: {q.text[:70]!r} task {q.task_id} hw {q.hardware}")


if __name__ == "__main__":
    main()
