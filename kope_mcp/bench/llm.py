"""The client of an OpenAI-compatible chat endpoint (vLLM, Ollama, llama.cpp, a hosted API) for `kope bench
--agent llm` and tools/llm_agent.py; the episode a model works is llm_episode.py.

Prompt and completion tokens come from the endpoint's `usage`. Retries: only 429 and 5xx, with exponential
backoff (Retry-After honoured); a timeout, scaled to the prompt (messages and tool schemas), is reported, not
resent (the endpoint may still be generating, and billing, the first answer); "context length exceeded" is
raised as ContextTooLong for the episode to trim and resend.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

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


def _timeout(prompt_tokens: int, base: float | None = None) -> float:
    return (BASE_TIMEOUT_S if base is None else base) + TIMEOUT_S_PER_1K_PROMPT * prompt_tokens / 1000


def chat(base_url: str, model: str, api_key: str | None, messages: list[dict[str, Any]],
         tools: list[dict[str, Any]], prompt_tokens: int, sleep: Any = time.sleep,
         base_timeout: float | None = None) -> dict[str, Any]:
    """One chat completion (OpenAI wire format): the whole response JSON (choices, usage). `prompt_tokens`
    (messages and tool schemas) scales the timeout from `base_timeout` (default BASE_TIMEOUT_S)."""
    body = json.dumps({"model": model, "messages": messages, "tools": tools, "tool_choice": "auto",
                       "temperature": 0.2}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    last = ""
    limit = _timeout(prompt_tokens, base_timeout)
    for attempt in range(RETRIES + 1):
        request = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=limit) as response:
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
            raise EndpointError(f"the chat endpoint did not answer within {limit:.0f} s "
                                f"(prompt ~{prompt_tokens} tokens); not resent") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise EndpointError(f"the chat endpoint did not answer within {limit:.0f} s") from None
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
    timeout_s: float | None = None  # the endpoint's base timeout per answer (None: BASE_TIMEOUT_S)
