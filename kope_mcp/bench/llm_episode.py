"""One task worked by a model, as one arm of the ablation: the same arms, readings, window and TaskRun as the
scripted agent (agent.py), so `kope bench --agent llm` runs the very protocol, judge, metrics and report of the
scripted bench; only who chooses differs.

What the model reads per arm: `none` nothing; `static`, `oracle` the strategy order once; `aa@W` that order and
the whole history every iteration; `passive@W` the whole history (`shuffled@W` with its lines shuffled) every
iteration; `active@W` query_experience's selection every iteration. The chat is a Transcript bounded to W
tokens less what the tool schemas take (the controls use --context-window). The episode ends when the model
calls `finish` (a tool offered next to the server's), when its compile budget is spent and it answers without
a tool call (further compiles are refused; the last kernel can still be tested and profiled), or after
`iterations` memory readings; never on what its text says. An endpoint that answers "context length exceeded"
gets the chat trimmed to half the window and resent, down to 1,000 tokens; past that the task ends ("context
limit"), the run goes on. The incumbent is the fastest kernel whose profile's CI lies above the previous one
and is not suspect (the scripted agent's rule); each change is kept in ``TaskRun.kept`` for the judge.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import TYPE_CHECKING, Any

import anyio
from mcp import Client

from kope_mcp.bench.agent import TaskRun, call_tool, parse_arm, read_history, shuffled_history
from kope_mcp.bench.llm import ContextTooLong, LlmSettings, Usage, chat, openai_tools, parse_arguments
from kope_mcp.bench.transcript import Transcript
from kope_mcp.experience.tokens import count_tokens

if TYPE_CHECKING:
    from kope_mcp.bench.protocol import AgentFn

SYSTEM = """You optimise kernels with the kope-mcp tools. Work in a loop: write a kernel, compile_kernel,
run_tests, profile_kernel, then improve. Always pass the session_id you were given and the parent_id of the
kernel you improve. Correctness first. Use the experience provided, if any: prefer what measurably worked,
avoid the listed pitfalls. Call record_experience with what you learned after each profile.
When you cannot improve further, call finish."""
FINISH = {"type": "function", "function": {
    "name": "finish", "description": "End this task: call it when you cannot improve your kernel further. The "
                                     "fastest correct kernel you measured is kept.",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
MIN_WINDOW = 1000

def llm_agent(settings: LlmSettings) -> AgentFn:
    """The model as the protocol's agent (protocol.py calls it as it calls agent.run_task)."""
    async def work(client: Client, task_id: str, arm: str, budget: int, seed: int,
                   ranking: list[str] | None = None, measure: object = None) -> TaskRun:
        # The model keeps what its own profiles tell it (the protocol unchanged): `measure` is the scripted
        # agent's shared figure, which a model never sees.
        return await run_llm_arm(client, settings, task_id, arm, budget, seed, ranking)
    return work


class _Episode:
    def __init__(self, run: TaskRun) -> None:
        self.run = run
        self.usage = Usage()
        self.kernels: dict[str, tuple[int, str, list[str]]] = {}  # kernel_id -> (attempt, source, flags)
        self.session_id: str | None = None
        self.finished = False

    def compiled(self, args: dict[str, Any], result: dict[str, Any]) -> None:
        run = self.run
        run.attempts += 1
        run.strategies.append(str(args.get("strategy") or ""))
        run.best_by_attempt.append(run.best_speedup)
        run.load.append(round(os.getloadavg()[0], 2))
        self.kernels[result["kernel_id"]] = (run.attempts, str(args.get("source") or ""),
                                             [str(f) for f in args.get("flags") or []])
        self.session_id = result.get("session_id", self.session_id)
        if not result.get("ok"):
            run.outcomes["compile_error"] = run.outcomes.get("compile_error", 0) + 1

    def tested(self, result: dict[str, Any]) -> None:
        run, kernel = self.run, self.kernels.get(str(result.get("kernel_id")))
        if kernel is None:
            return
        if result.get("passed"):
            run.first_correct = run.first_correct or kernel[0]
        else:
            run.outcomes["incorrect"] = run.outcomes.get("incorrect", 0) + 1

    def profiled(self, result: dict[str, Any]) -> None:
        run, kernel = self.run, self.kernels.get(str(result.get("kernel_id")))
        if kernel is None:
            return
        for flag in ("suspect", "noisy"):
            if result.get(flag):
                run.verdicts[flag] = run.verdicts.get(flag, 0) + 1
        if result.get("failure") == "timing_unverified":
            run.verdicts["timing_unverified"] = run.verdicts.get("timing_unverified", 0) + 1
        if result.get("failure") or result.get("speedup_vs_baseline") is None:
            return
        speedup, low = float(result["speedup_vs_baseline"]), float(result["speedup_vs_baseline_ci95"][0])
        if low > run.best_speedup and not result.get("suspect"):
            run.outcomes["faster"] = run.outcomes.get("faster", 0) + 1
            run.best_speedup = speedup
            run.best_by_attempt[-1] = speedup
            run.kept.append([run.attempts, kernel[1], kernel[2]])
        else:
            run.outcomes["correct"] = run.outcomes.get("correct", 0) + 1


async def run_llm_arm(client: Client, settings: LlmSettings, task_id: str, arm: str, budget: int, seed: int,
                      ranking: list[str] | None = None) -> TaskRun:
    started = time.monotonic()
    policy, window = parse_arm(arm)
    task = await call_tool(client, "get_task", task_id=task_id)
    run = TaskRun(task_id=task_id, family=task["family"], policy=arm, seed=seed, budget=budget)
    run.kept.append([0, task.get("baseline_source") or "", []])
    tools = [*openai_tools((await client.list_tools()).tools), FINISH]
    names = {t["function"]["name"] for t in tools}
    schema_tokens = count_tokens(json.dumps(tools))
    # The window holds the whole prompt: the tool schemas take their share of it first.
    transcript = Transcript(max(MIN_WINDOW, (window or settings.context_window) - schema_tokens))
    transcript.add("system", SYSTEM, pinned=True)
    transcript.add("user", f"Task {task_id}:\n{json.dumps(task, indent=1)[:12000]}", pinned=True)
    if ranking is not None and policy in ("static", "oracle", "aa"):
        where = "during the warm-up" if policy in ("static", "aa") else "on this task"
        transcript.add("user", f"Strategies in the order that paid off most {where}: " + "; ".join(ranking))
        run.context_tokens += transcript.messages[-1].tokens
    episode = _Episode(run)
    rng = random.Random(f"{seed}/shuffle/{task_id}")
    for _ in range(settings.iterations):
        if episode.finished:
            break
        read = await _read(client, policy, task_id, episode.session_id, settings.token_budget, rng)
        if read is not None:
            text, items = read
            before = transcript.tokens + transcript.dropped_tokens
            transcript.add("user", text + (f"\nYour session_id: {episode.session_id}" if episode.session_id else ""),
                           items=items)
            run.context_tokens += transcript.tokens + transcript.dropped_tokens - before
            run.items_seen.append(len(transcript.visible_items()))
        quiet = False
        for _ in range(settings.max_tool_calls):
            reply = await _complete(settings, transcript, tools, schema_tokens, episode)
            if reply is None:
                episode.finished = True  # the context limit: nothing more fits
                break
            calls = reply.get("tool_calls") or []
            transcript.add("assistant", str(reply.get("content") or ""), wire={"tool_calls": calls} if calls else None)
            if not calls:
                quiet = True
                break
            for call in calls:
                transcript.add("tool", await _execute(client, call, names, episode, budget),
                               wire={"tool_call_id": call.get("id", "")})
            if episode.finished:
                break
        if quiet and run.attempts >= budget:
            break  # the budget is spent (the last kernel could still be tested and profiled) and it stopped
    run.seconds = time.monotonic() - started
    run.peak_tokens, run.dropped_tokens = transcript.peak_tokens, transcript.dropped_tokens
    run.prompt_tokens, run.completion_tokens = episode.usage.prompt_tokens, episode.usage.completion_tokens
    run.model_calls = episode.usage.calls
    run.stopped = run.stopped or ("finish" if episode.finished else
                                  "budget" if run.attempts >= budget else "iterations")
    return run


async def _read(client: Client, policy: str, task_id: str, session_id: str | None, budget: int,
                rng: random.Random) -> tuple[str, list[dict[str, Any]]] | None:
    if policy in ("passive", "shuffled", "aa"):
        history = await read_history(client)
        text = shuffled_history(history, rng)[0] if policy == "shuffled" else history["context"]
        return "Your whole experience memory (kope-mcp):\n" + text, []
    if policy == "active":
        query: dict[str, Any] = {"query": f"next step on {task_id}", "task_id": task_id, "token_budget": budget}
        if session_id:
            query["session_id"] = session_id
        advice = await call_tool(client, "query_experience", **query)
        return "Relevant experience (kope-mcp memory):\n" + str(advice.get("context", "")), []
    return None


async def _complete(settings: LlmSettings, transcript: Transcript, tools: list[dict[str, Any]], schema_tokens: int,
                    episode: _Episode) -> dict[str, Any] | None:
    """The model's next message; on "context length exceeded" the chat is trimmed to half and resent, down to
    MIN_WINDOW tokens; None when even that does not fit (the task ends, the run goes on)."""
    while True:
        try:
            answer = await anyio.to_thread.run_sync(chat, settings.base_url, settings.model, settings.api_key,
                                                    transcript.wire_messages(), tools,
                                                    transcript.tokens + schema_tokens, time.sleep,
                                                    settings.timeout_s)
            break
        except ContextTooLong:
            current = transcript.window or settings.context_window
            if current <= MIN_WINDOW:
                episode.run.stopped = "context limit"
                return None
            episode.run.trimmed_retries += 1
            transcript.window = max(MIN_WINDOW, current // 2)
            transcript.add("user", "(earlier messages were dropped to fit the model's context)")
    episode.usage.add(answer.get("usage"))
    message: dict[str, Any] = answer["choices"][0]["message"]
    return message


async def _execute(client: Client, call: dict[str, Any], names: set[str], episode: _Episode, budget: int) -> str:
    """Run one tool call; anything wrong comes back as text the model can act on."""
    name = call.get("function", {}).get("name", "")
    if name not in names:
        episode.run.tool_errors += 1
        return f"error: no tool named {name!r}; tools are {sorted(names)}"
    try:
        arguments = parse_arguments(call["function"].get("arguments"))
    except (json.JSONDecodeError, ValueError) as exc:
        episode.run.tool_errors += 1
        return f"error: the arguments of {name} are not a JSON object ({exc}); send a JSON object"
    episode.run.tool_calls += 1
    if name == "finish":
        episode.finished = True
        return "finished: your fastest measured kernel is kept"
    if name == "compile_kernel" and episode.run.attempts >= budget:
        return f"error: the budget of {budget} compiles is spent; call finish"
    result = await client.call_tool(name, arguments)
    text = "\n".join(getattr(c, "text", "") for c in result.content)[:20000]
    structured = None if result.is_error else result.structured_content
    if structured is None:
        episode.run.tool_errors += 1
    elif name == "compile_kernel":
        episode.compiled(arguments, structured)
    elif name == "run_tests":
        episode.tested(structured)
    elif name == "profile_kernel":
        episode.profiled(structured)
        episode.run.hardware = episode.run.hardware or (structured.get("hardware") or {}).get("key")
    return text
