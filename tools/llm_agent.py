#!/usr/bin/env python3
"""The KOPE loop driven by a real LLM through any OpenAI-compatible chat endpoint (vLLM, Ollama, llama.cpp,
a hosted API), with kope-mcp's tools as its only actions.

    python tools/llm_agent.py --base-url http://localhost:11434/v1 --model qwen2.5-coder:14b --task matmul
    OPENAI_API_KEY=... python tools/llm_agent.py --base-url https://api.example/v1 --model m --task softmax

Each iteration injects query_experience's context (the memory's selection for the current state, within
--token-budget) as a user message, then lets the model call tools (get_task, compile_kernel, run_tests,
profile_kernel, record_experience, ...) until it answers without a tool call. It stops after --attempts
compiles or when the model says DONE. Tool errors and malformed tool calls go back to the model as tool
results, so it can correct itself; endpoint failures are retried twice, then reported.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.types import Implementation

SYSTEM = """You optimise C kernels with the kope-mcp tools. Work in a loop: write a kernel, compile_kernel,
run_tests, profile_kernel, then improve. Always pass the session_id you were given and the parent_id of the
kernel you improve. Correctness first. Use the experience provided each iteration: prefer what measurably
worked, avoid the listed pitfalls. Call record_experience with what you learned after each profile.
When you cannot improve further, answer with the single word DONE."""


class EndpointError(RuntimeError):
    pass


def chat(base_url: str, model: str, api_key: str | None, messages: list[dict[str, Any]],
         tools: list[dict[str, Any]], timeout_s: float = 300.0) -> dict[str, Any]:
    """One chat completion (OpenAI wire format); retried twice on transport errors and 5xx."""
    body = json.dumps({"model": model, "messages": messages, "tools": tools, "tool_choice": "auto",
                       "temperature": 0.2}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    last = ""
    for attempt in range(3):
        request = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return json.loads(response.read())["choices"][0]["message"]
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
            if exc.code < 500:
                break
        except (urllib.error.URLError, TimeoutError, KeyError, IndexError, json.JSONDecodeError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(1.0 * (attempt + 1))
    raise EndpointError(f"the chat endpoint failed: {last}")


def openai_tools(mcp_tools: list[Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": t.name, "description": (t.description or "")[:1000],
                                              "parameters": t.input_schema}} for t in mcp_tools]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    command = shlex.split(args.server)
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    summary: dict[str, Any] = {"task": args.task, "compiles": 0, "tool_calls": 0, "tool_errors": 0,
                               "best_speedup": None, "context_tokens": 0, "stopped": "budget"}
    try:
        async with Client(params, client_info=Implementation(name="llm-agent", version=args.model)) as client:
            await _loop(client, args, api_key, summary)
    except BaseExceptionGroup as group:  # the client's task group wraps what went wrong inside it
        endpoint = [e for e in _leaves(group) if isinstance(e, EndpointError)]
        if endpoint:
            raise endpoint[0] from None
        raise
    return summary


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


async def _loop(client: Client, args: argparse.Namespace, api_key: str | None, summary: dict[str, Any]) -> None:
    tools = openai_tools((await client.list_tools()).tools)
    names = {t["function"]["name"] for t in tools}
    task = (await client.call_tool("get_task", {"task_id": args.task})).structured_content or {}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {args.task}:\n{json.dumps(task, indent=1)[:12000]}"},
    ]
    session_id: str | None = None
    for _ in range(args.iterations):
        query: dict[str, Any] = {"query": f"next step on {args.task}", "task_id": args.task,
                                 "token_budget": args.token_budget}
        if session_id:
            query["session_id"] = session_id
        advice = (await client.call_tool("query_experience", query)).structured_content or {}
        summary["context_tokens"] += int(advice.get("tokens_used", 0))
        messages.append({"role": "user", "content": "Relevant experience (kope-mcp memory):\n"
                         + str(advice.get("context", "")) + (f"\nYour session_id: {session_id}"
                                                             if session_id else "")})
        for _ in range(args.max_tool_calls):
            reply = await anyio.to_thread.run_sync(chat, args.base_url, args.model, api_key, messages, tools)
            messages.append({k: v for k, v in reply.items() if k in ("role", "content", "tool_calls")})
            calls = reply.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                result_text, structured = await _execute(client, call, names)
                summary["tool_calls"] += 1
                if structured is None:
                    summary["tool_errors"] += 1
                elif call["function"]["name"] == "compile_kernel":
                    summary["compiles"] += 1
                    session_id = structured.get("session_id", session_id)
                elif call["function"]["name"] == "profile_kernel":
                    speed = structured.get("speedup_vs_baseline")
                    if speed is not None and (summary["best_speedup"] is None or speed > summary["best_speedup"]):
                        summary["best_speedup"] = speed
                messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result_text})
        if "DONE" in str(messages[-1].get("content") or ""):
            summary["stopped"] = "model said DONE"
            break
        if summary["compiles"] >= args.attempts:
            break


async def _execute(client: Client, call: dict[str, Any], names: set[str]) -> tuple[str, dict[str, Any] | None]:
    """Run one tool call; anything wrong comes back as text the model can act on."""
    name = call.get("function", {}).get("name", "")
    if name not in names:
        return f"error: no tool named {name!r}; tools are {sorted(names)}", None
    try:
        arguments = json.loads(call["function"].get("arguments") or "{}")
    except json.JSONDecodeError as exc:
        return f"error: the arguments of {name} are not valid JSON ({exc}); send a JSON object", None
    result = await client.call_tool(name, arguments)
    text = "\n".join(getattr(c, "text", "") for c in result.content)[:20000]
    return text, None if result.is_error else result.structured_content


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible API root, e.g. http://host:8000/v1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable with the API key")
    parser.add_argument("--task", default="matmul")
    parser.add_argument("--attempts", type=int, default=8, help="stop after this many compile_kernel calls")
    parser.add_argument("--iterations", type=int, default=12, help="experience injections at most")
    parser.add_argument("--max-tool-calls", type=int, default=8, help="tool calls per iteration at most")
    parser.add_argument("--token-budget", type=int, default=2000, help="query_experience budget per iteration")
    parser.add_argument("--server", default=f"{sys.executable} -m kope_mcp serve", help="the MCP server command")
    try:
        print(json.dumps(anyio.run(run, parser.parse_args()), indent=1))
    except EndpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
