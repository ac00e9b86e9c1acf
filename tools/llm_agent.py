#!/usr/bin/env python3
"""One task worked by a real LLM through any OpenAI-compatible chat endpoint (vLLM, Ollama, llama.cpp, a hosted
API), with kope-mcp's tools as its only actions. The episode is `kope bench --agent llm`'s
(kope_mcp/bench/llm_episode.py); this script runs it once, on one task, as one arm, against the server you name,
and prints the run as JSON.

    python tools/llm_agent.py --base-url http://localhost:11434/v1 --model qwen2.5-coder:14b --task matmul
    OPENAI_API_KEY=... python tools/llm_agent.py --base-url https://api.example/v1 --model m --task softmax \\
        --arm passive@128k
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import asdict

import anyio
from mcp import Client, StdioServerParameters
from mcp.types import Implementation

from kope_mcp.bench.llm import LlmSettings, endpoint_failure
from kope_mcp.bench.llm_episode import run_llm_arm


async def run(args: argparse.Namespace) -> dict:
    command = shlex.split(args.server)
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    settings = LlmSettings(base_url=args.base_url, model=args.model, context_window=args.context_window,
                           api_key=os.environ.get(args.api_key_env) if args.api_key_env else None,
                           attempts=args.attempts, iterations=args.iterations, max_tool_calls=args.max_tool_calls,
                           token_budget=args.token_budget, timeout_s=args.timeout)
    async with Client(params, client_info=Implementation(name="llm-agent", version=args.model)) as client:
        return asdict(await run_llm_arm(client, settings, args.task, args.arm, args.attempts, seed=0))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible API root, e.g. http://host:8000/v1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable with the API key")
    parser.add_argument("--task", default="matmul")
    parser.add_argument("--arm", default="active@32k",
                        help="what the model reads: none, passive@W, shuffled@W or active@W (W in thousands of tokens)")
    parser.add_argument("--context-window", type=int, default=32_000, help="the chat's window for --arm none")
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait for an answer (default 60)")
    parser.add_argument("--attempts", type=int, default=8, help="stop after this many compile_kernel calls")
    parser.add_argument("--iterations", type=int, default=12, help="memory injections at most")
    parser.add_argument("--max-tool-calls", type=int, default=8, help="tool calls per iteration at most")
    parser.add_argument("--token-budget", type=int, default=2000, help="query_experience budget per iteration")
    parser.add_argument("--server", default=f"{sys.executable} -m kope_mcp serve", help="the MCP server command")
    try:
        print(json.dumps(anyio.run(run, parser.parse_args()), indent=1))
    except BaseException as exc:  # the MCP client's task group wraps what failed inside it
        failure = endpoint_failure(exc)
        if failure is None:
            raise
        print(f"error: {failure}", file=sys.stderr)
        sys.exit(2)
