"""`kope bench`: its command-line options and what they run (kept light: the heavy imports happen in the run)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def add_bench_parser(sub: Any) -> None:
    bench = sub.add_parser("bench", help="the KOPE ablation: none, static, oracle, passive and active on held-out "
                                         "tasks, at several context windows")
    bench.add_argument("--quick", action="store_true", help="CI-sized: 3 families, 1 seed, 4 attempts (minutes)")
    bench.add_argument("--seeds", type=int, help="seeds (default 1; each re-splits warm-up and held-out tasks)")
    bench.add_argument("--budget", type=int, help="attempts per task (default 8; --quick 4)")
    bench.add_argument("--held-per-family", type=int, help="held-out tasks per family (default 1)")
    bench.add_argument("--one-core-warmup", action=argparse.BooleanOptionalAction, default=None,
                       help="also warm up pinned to one core and import it as other hardware (default: on; "
                            "--quick: off)")
    bench.add_argument("--families", nargs="*", help="only these families (default: all)")
    bench.add_argument("--out", help="results folder (default: results/bench-<timestamp>)")
    bench.add_argument("--windows", type=int, nargs="*",
                       help="context windows (tokens) the scripted agent reads through (default: 8000 32000 128000 "
                            "200000; --quick: 8000)")
    bench.add_argument("--warm-passes", type=int, help="passes of the warm-up over its tasks (default 1)")
    bench.add_argument("--warm-budget", type=int, help="attempts per task in the warm-up (default: --budget; 14 "
                                                      "tries every strategy that applies)")
    bench.add_argument("--import-memory", nargs="*", default=[], metavar="FILE",
                       help="kope-memory exports to add to the warmed memory (e.g. another machine's experience)")
    bench.add_argument("--memory-sizes", type=int, nargs="*", metavar="N",
                       help="also run static and the memory arms from a seeded family-stratified sample of N "
                            "attempts of the warmed memory (the curve; default 40 80 160)")
    bench.add_argument("--resume", metavar="DIR", help="go on with the stopped run in DIR (its own configuration; "
                                                      "finished warm-ups and tasks are kept)")
    bench.add_argument("--report", metavar="DIR", help="only re-render DIR/report.md and its plots from "
                                                      "DIR/results.json (a stopped run keeps what it measured)")
    bench.add_argument("--agent", choices=["scripted", "llm"], default="scripted",
                       help="scripted (default), or llm: a model behind an OpenAI-compatible endpoint")
    bench.add_argument("--base-url", help="llm: the API root, e.g. http://127.0.0.1:8000/v1")
    bench.add_argument("--model", help="llm: the model name the endpoint serves")
    bench.add_argument("--api-key-env", default="OPENAI_API_KEY",
                       help="llm: the environment variable holding the API key (default OPENAI_API_KEY; unset: none)")
    bench.add_argument("--context-window", type=int, default=32_000,
                       help="llm: the window of the controls (none, static, oracle); the memory arms use their own "
                            "(--windows) (default 32000)")
    bench.add_argument("--max-tokens", type=int, metavar="N",
                       help="llm: the token budget (prompt and completion, by the endpoint's usage): a run whose "
                            "estimate is larger does not start, and a run stops between tasks once it has spent N "
                            "(--resume goes on)")
    bench.add_argument("--estimate", action="store_true",
                       help="llm: print the estimated prompt tokens per arm for this configuration and exit")
    bench.add_argument("--timeout", type=float, default=None,
                       help="llm: seconds to wait for an answer, plus 2 s per 1k prompt tokens (default 60)")


def run_bench_command(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    import anyio

    from kope_mcp.bench.runner import full_config, quick_config, run_bench

    out = Path(args.out or f"results/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    config = quick_config(out) if args.quick else full_config(out)
    for name in ("seeds", "budget", "held_per_family", "one_core_warmup", "warm_passes", "warm_budget"):
        if getattr(args, name) is not None:
            setattr(config, name, getattr(args, name))
    if args.memory_sizes is not None:
        config.memory_sizes = tuple(args.memory_sizes)
    if args.families:
        config.families = tuple(args.families)
    missing = [f for f in args.import_memory if not Path(f).is_file()]
    numbers = [config.seeds, config.budget, config.warm_passes, config.warm_budget or 1,
               config.held_per_family or 1, *config.memory_sizes]
    if missing or any(n < 1 for n in numbers):
        print(f"error: --import-memory takes existing kope-memory export files (not found: {missing}); --seeds, "
              "--budget, --warm-passes, --warm-budget, --held-per-family and --memory-sizes take positive numbers",
              file=sys.stderr)
        return 2
    config.imports = tuple(Path(f) for f in args.import_memory)
    if args.windows:
        if any(w < 1000 for w in args.windows):
            print(f"error: --windows takes token counts of at least 1000, got {args.windows}", file=sys.stderr)
            return 2
        config.windows = tuple(args.windows)
    if args.report:
        from kope_mcp.bench.runner import write_report

        if not (Path(args.report) / "results.json").is_file():
            print(f"error: {args.report} holds no results.json (give the --out folder of a kope bench run)",
                  file=sys.stderr)
            return 2
        config.out = Path(args.report)
        report = write_report(config)
        print(report.read_text())
        print(f"report: {report}")
        return 0
    if args.resume:
        from kope_mcp.bench.config import CONFIG_FILE, load_config

        if not (Path(args.resume) / CONFIG_FILE).is_file():
            print(f"error: {args.resume} holds no {CONFIG_FILE} (give the --out folder of a kope bench run started "
                  "by this version)", file=sys.stderr)
            return 2
        config = load_config(Path(args.resume))
    agent = None
    if args.agent == "llm":
        from kope_mcp.bench.llm import LlmSettings
        from kope_mcp.bench.llm_episode import llm_agent
        from kope_mcp.bench.runner import planned_estimate

        cost = planned_estimate(config, args.context_window)
        print("\n".join(cost.lines()), file=sys.stderr)
        if args.estimate:
            return 0
        if not args.base_url or not args.model:
            print("error: --agent llm needs --base-url (an OpenAI-compatible API root, e.g. "
                  "http://127.0.0.1:8000/v1) and --model", file=sys.stderr)
            return 2
        if args.max_tokens is not None and not args.resume and cost.total > args.max_tokens:
            print(f"error: the estimate ({cost.total:,} prompt tokens) is over --max-tokens {args.max_tokens:,}: "
                  "raise it, or run less (--quick, --held-per-family, --memory-sizes, --windows)", file=sys.stderr)
            return 2
        agent = llm_agent(LlmSettings(base_url=args.base_url, model=args.model, context_window=args.context_window,
                                      api_key=os.environ.get(args.api_key_env) if args.api_key_env else None,
                                      attempts=config.budget, timeout_s=args.timeout))
    if args.max_tokens is not None:
        config.max_tokens = args.max_tokens
    from kope_mcp.bench.llm import endpoint_failure

    try:
        report = anyio.run(run_bench, config, bool(args.resume), agent)
    except BaseException as exc:  # the MCP client's task group wraps what failed inside it
        failure = endpoint_failure(exc)
        if failure is None:
            raise
        print(f"error: {failure}", file=sys.stderr)
        return 2
    print(report.read_text())
    print(f"report: {report}")
    return 0
