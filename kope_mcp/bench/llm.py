"""The KOPE loop driven by a real LLM through any OpenAI-compatible chat endpoint (vLLM, Ollama, llama.cpp, a
hosted API), with kope-mcp's tools as its only actions: `kope bench --agent llm` and tools/llm_agent.py.

Per task, the model gets the task and, each iteration, what its policy reads: nothing (`none`), the whole memory
(`passive`: kope://memory/history) or query_experience's selection (`active`); then it calls tools until it
answers without a tool call. The chat is kept in a Transcript bounded to the user's --context-window (oldest
exchanges dropped first, as a chat client does); an endpoint that still answers "context length exceeded" (400)
gets the same chat trimmed to half the window once. Prompt and completion tokens come from the endpoint's
`usage`. Retries: only 429 and 5xx, with exponential backoff (Retry-After honoured); a timeout, scaled to the
prompt, is reported, not resent (the endpoint may still be generating, and billing, the first answer).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
from mcp import Client

from kope_mcp.bench.transcript import Transcript

SYSTEM = """You optimise kernels with the kope-mcp tools. Work in a loop: write a kernel, compile_kernel,
run_tests, profile_kernel, then improve. Always pass the session_id you were given and the parent_id of the
kernel you improve. Correctness first. Use the experience provided, if any: prefer what measurably worked,
avoid the listed pitfalls. Call record_experience with what you learned after each profile.
When you cannot improve further, answer with the single word DONE."""
LLM_POLICIES = ("none", "passive", "active")
RETRIES = 4
BASE_TIMEOUT_S = 60.0
TIMEOUT_S_PER_1K_PROMPT = 2.0  # a long prompt takes longer before the first token


class EndpointError(RuntimeError):
    pass


class ContextTooLong(EndpointError):
    pass


def endpoint_failure(exc: BaseException) -> EndpointError | None:
    """The endpoint's failure inside what an MCP client's task group raised, if that is what went wrong."""
    if isinstance(exc, EndpointError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = endpoint_failure(inner)
            if found is not None:
                return found
    return None


@dataclass
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    per_call_prompt: list[int] = field(default_factory=list)

    def add(self, usage: dict[str, Any] | None) -> None:
        self.calls += 1
        prompt = int((usage or {}).get("prompt_tokens") or 0)
        self.prompt_tokens += prompt
        self.completion_tokens += int((usage or {}).get("completion_tokens") or 0)
        self.per_call_prompt.append(prompt)


@dataclass
class LlmTaskRun:
    task_id: str
    policy: str
    compiles: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    best_speedup: float | None = None
    context_tokens: int = 0  # what the policy injected (query_experience's tokens_used, or the history's)
    trimmed_retries: int = 0
    stopped: str = "budget"
    usage: Usage = field(default_factory=Usage)
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _timeout(prompt_tokens: int) -> float:
    return BASE_TIMEOUT_S + TIMEOUT_S_PER_1K_PROMPT * prompt_tokens / 1000


def chat(base_url: str, model: str, api_key: str | None, messages: list[dict[str, Any]],
         tools: list[dict[str, Any]], prompt_tokens: int, sleep: Any = time.sleep) -> dict[str, Any]:
    """One chat completion (OpenAI wire format): the whole response JSON (choices, usage)."""
    body = json.dumps({"model": model, "messages": messages, "tools": tools, "tool_choice": "auto",
                       "temperature": 0.2}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    last = ""
    for attempt in range(RETRIES + 1):
        request = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=_timeout(prompt_tokens)) as response:
                answer: dict[str, Any] = json.loads(response.read())
                _ = answer["choices"][0]["message"]  # a malformed answer fails here, not later
                return answer
        except urllib.error.HTTPError as exc:
            text = exc.read()[:500].decode(errors="replace")
            last = f"HTTP {exc.code}: {text}"
            if exc.code == 400 and "context" in text.lower() and ("length" in text.lower() or "long" in text.lower()):
                raise ContextTooLong(last) from None
            if exc.code != 429 and exc.code < 500:
                raise EndpointError(f"the chat endpoint refused the request: {last}") from None
            retry_after = exc.headers.get("Retry-After") if exc.headers else None
            delay = float(retry_after) if retry_after and retry_after.isdigit() else 2.0 ** attempt
        except TimeoutError:
            raise EndpointError(f"the chat endpoint did not answer within {_timeout(prompt_tokens):.0f} s "
                                f"(prompt ~{prompt_tokens} tokens); not resent") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise EndpointError(f"the chat endpoint did not answer within {_timeout(prompt_tokens):.0f} s"
                                    ) from None
            raise EndpointError(f"the chat endpoint is unreachable: {exc.reason}") from None
        except (KeyError, IndexError, TypeError, json.JSONDecodeError) as exc:
            raise EndpointError(f"the chat endpoint answered something that is not a chat completion: "
                                f"{type(exc).__name__}: {exc}") from None
        if attempt < RETRIES:
            sleep(delay)
    raise EndpointError(f"the chat endpoint kept failing after {RETRIES + 1} tries: {last}")


def openai_tools(mcp_tools: list[Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": t.name, "description": (t.description or "")[:1000],
                                              "parameters": t.input_schema}} for t in mcp_tools]


def parse_arguments(raw: Any) -> dict[str, Any]:
    """Tool arguments as the endpoint sent them: a JSON string (the spec) or an object (some servers)."""
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


@dataclass
class LlmSettings:
    base_url: str
    model: str
    api_key: str | None = None
    context_window: int = 32_000
    attempts: int = 8  # compile_kernel calls per task
    iterations: int = 12  # memory injections per task at most
    max_tool_calls: int = 8  # tool calls per iteration at most
    token_budget: int = 2000  # query_experience's budget


async def run_llm_task(client: Client, settings: LlmSettings, task_id: str, policy: str) -> LlmTaskRun:
    started = time.monotonic()
    run = LlmTaskRun(task_id=task_id, policy=policy)
    tools = openai_tools((await client.list_tools()).tools)
    names = {t["function"]["name"] for t in tools}
    task = (await client.call_tool("get_task", {"task_id": task_id})).structured_content or {}
    transcript = Transcript(settings.context_window)
    transcript.add("system", SYSTEM, pinned=True)
    transcript.add("user", f"Task {task_id}:\n{json.dumps(task, indent=1)[:12000]}", pinned=True)
    session_id: str | None = None
    for _ in range(settings.iterations):
        injected = await _read_memory(client, policy, task_id, session_id, settings.token_budget)
        if injected is not None:
            text, tokens = injected
            run.context_tokens += tokens
            transcript.add("user", text + (f"\nYour session_id: {session_id}" if session_id else ""))
        for _ in range(settings.max_tool_calls):
            reply = await _complete(settings, transcript, tools, run)
            calls = reply.get("tool_calls") or []
            transcript.add("assistant", str(reply.get("content") or ""),
                           wire={"tool_calls": calls} if calls else None)
            if not calls:
                break
            for call in calls:
                text, structured = await _execute(client, call, names)
                run.tool_calls += 1
                name = call.get("function", {}).get("name", "")
                if structured is None:
                    run.tool_errors += 1
                elif name == "compile_kernel":
                    run.compiles += 1
                    session_id = structured.get("session_id", session_id)
                elif name == "profile_kernel" and structured.get("speedup_vs_baseline") is not None:
                    run.best_speedup = max(run.best_speedup or 0.0, float(structured["speedup_vs_baseline"]))
                transcript.add("tool", text, wire={"tool_call_id": call.get("id", "")})
        if "DONE" in str(transcript.messages[-1].text):
            run.stopped = "model said DONE"
            break
        if run.compiles >= settings.attempts:
            break
    run.seconds = time.monotonic() - started
    return run


async def _complete(settings: LlmSettings, transcript: Transcript, tools: list[dict[str, Any]],
                    run: LlmTaskRun) -> dict[str, Any]:
    try:
        answer = await anyio.to_thread.run_sync(chat, settings.base_url, settings.model, settings.api_key,
                                                transcript.wire_messages(), tools, transcript.tokens)
    except ContextTooLong:
        # Our count and the endpoint's tokenizer differ: trim to half the window and ask once more.
        run.trimmed_retries += 1
        transcript.window = max(1000, (transcript.window or settings.context_window) // 2)
        transcript.add("user", "(earlier messages were dropped to fit the model's context)")
        answer = await anyio.to_thread.run_sync(chat, settings.base_url, settings.model, settings.api_key,
                                                transcript.wire_messages(), tools, transcript.tokens)
    run.usage.add(answer.get("usage"))
    message: dict[str, Any] = answer["choices"][0]["message"]
    return message


async def _read_memory(client: Client, policy: str, task_id: str, session_id: str | None,
                       budget: int) -> tuple[str, int] | None:
    if policy == "none":
        return None
    if policy == "passive":
        raw = "".join(getattr(c, "text", "") for c in
                      (await client.read_resource("kope://memory/history.json")).contents)
        history = json.loads(raw)
        return "Your whole experience memory (kope-mcp):\n" + history["context"], int(history["tokens"])
    query: dict[str, Any] = {"query": f"next step on {task_id}", "task_id": task_id, "token_budget": budget}
    if session_id:
        query["session_id"] = session_id
    advice = (await client.call_tool("query_experience", query)).structured_content or {}
    return "Relevant experience (kope-mcp memory):\n" + str(advice.get("context", "")), \
        int(advice.get("tokens_used", 0))


async def _execute(client: Client, call: dict[str, Any], names: set[str]) -> tuple[str, dict[str, Any] | None]:
    """Run one tool call; anything wrong comes back as text the model can act on."""
    name = call.get("function", {}).get("name", "")
    if name not in names:
        return f"error: no tool named {name!r}; tools are {sorted(names)}", None
    try:
        arguments = parse_arguments(call["function"].get("arguments"))
    except (json.JSONDecodeError, ValueError) as exc:
        return f"error: the arguments of {name} are not a JSON object ({exc}); send a JSON object", None
    result = await client.call_tool(name, arguments)
    text = "\n".join(getattr(c, "text", "") for c in result.content)[:20000]
    return text, None if result.is_error else result.structured_content
