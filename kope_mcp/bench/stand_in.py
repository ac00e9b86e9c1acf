"""A stand-in for an OpenAI-compatible chat endpoint, for testing `kope bench --agent llm` without a model.

It plays a fixed, simple agent: compile the task's naive kernel with -O3 (from the task statement in the chat),
run its tests, profile it, record a lesson, then call `finish` (answer DONE where no such tool is offered). Like a
real endpoint it reports `usage` (prompt and completion tokens counted in cl100k_base, the tool schemas
included, as a served model's prompt holds them), answers 400 "context_length_exceeded" when the prompt is over its
--max-context, can be slow (--delay), and can send tool arguments as a JSON object instead of a string
(--object-arguments), as some servers do.

    python -m kope_mcp.bench.stand_in --port 8400 --max-context 16000
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kope_mcp.experience.tokens import count_tokens

_TASK = re.compile(r"^Task (?P<task>[\w.-]+):", re.M)


def prompt_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    text = "".join(str(m.get("content") or "") + json.dumps(m.get("tool_calls") or "") for m in messages)
    return count_tokens(text) + 4 * len(messages) + (count_tokens(json.dumps(tools)) if tools else 0)


def _baseline(messages: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    for m in messages:
        content = str(m.get("content") or "")
        found = _TASK.search(content)
        if found and '"baseline_source": "' in content:
            at = content.index('"baseline_source": "') + len('"baseline_source": ')
            source, _ = json.JSONDecoder().raw_decode(content, at)
            return found["task"], source
    return None, None


def next_message(messages: list[dict[str, Any]], object_arguments: bool, turn: int,
                 tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The stand-in agent's next step, from the last tool result in the chat."""
    offered = {t.get("function", {}).get("name") for t in tools or []}
    done = _done(offered, object_arguments, turn)
    last = messages[-1]
    result: dict[str, Any] = {}
    if last.get("role") == "tool":
        try:
            result = json.loads(str(last.get("content") or "{}"))
        except json.JSONDecodeError:
            result = {}
    session = re.findall(r"Your session_id: (s-[\w-]+)", " ".join(str(m.get("content") or "") for m in messages))

    def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
        arguments: Any = args if object_arguments else json.dumps(args)
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": f"call-{turn}", "type": "function",
                                "function": {"name": name, "arguments": arguments}}]}

    if "kernel_id" in result and "ok" in result:
        return call("run_tests", {"kernel_id": result["kernel_id"]}) if result["ok"] else \
            done
    if "passed" in result:
        return call("profile_kernel", {"kernel_id": result.get("kernel_id") or _last_id(messages)}) \
            if result["passed"] else done
    if "speedup_vs_baseline" in result:
        return call("record_experience", {"kernel_id": _last_id(messages),
                                          "session_id": _last_id(messages, "session_id", "s"),
                                          "strategy": "compiler flags -O3",
                                          "lesson": "-O3 on the naive kernel, as measured"})
    if "experience_id" in result or str(last.get("content") or "").startswith("finished"):
        return done
    task, source = _baseline(messages)
    if task is None or source is None:
        return done
    args: dict[str, Any] = {"task_id": task, "source": source, "flags": ["-O3"], "strategy": "compiler flags -O3"}
    if session:
        args["session_id"] = session[-1]
    return call("compile_kernel", args)


def _done(offered: set[Any], object_arguments: bool, turn: int) -> dict[str, Any]:
    if "finish" not in offered:
        return {"role": "assistant", "content": "DONE"}
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"call-{turn}", "type": "function",
                            "function": {"name": "finish", "arguments": {} if object_arguments else "{}"}}]}


def _last_id(messages: list[dict[str, Any]], field: str = "kernel_id", prefix: str = "k") -> str:
    for m in reversed(messages):
        if m.get("role") == "tool":
            found = re.search(rf'"{field}": "({prefix}-[\w-]+)"', str(m.get("content") or ""))
            if found:
                return found.group(1)
    return ""


class StandInEndpoint:
    def __init__(self, port: int = 0, max_context: int = 128_000, delay_s: float = 0.0,
                 object_arguments: bool = False) -> None:
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                tokens = prompt_tokens(body["messages"], body.get("tools"))
                if delay_s:
                    time.sleep(delay_s)
                if tokens > max_context:
                    self._send(400, {"error": {"message": f"This model's maximum context length is {max_context} "
                                               f"tokens. However, your messages resulted in {tokens} tokens.",
                                               "type": "invalid_request_error", "code": "context_length_exceeded"}})
                    return
                message = next_message(body["messages"], object_arguments, len(outer.requests), body.get("tools"))
                completion = count_tokens(json.dumps(message))
                self._send(200, {"id": f"chatcmpl-{len(outer.requests)}", "object": "chat.completion",
                                 "model": body.get("model"), "choices": [{"index": 0, "message": message,
                                                                         "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": tokens, "completion_tokens": completion,
                                           "total_tokens": tokens + completion}})

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def start(self) -> StandInEndpoint:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8400)
    parser.add_argument("--max-context", type=int, default=128_000)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--object-arguments", action="store_true")
    args = parser.parse_args()
    endpoint = StandInEndpoint(args.port, args.max_context, args.delay, args.object_arguments)
    print(f"stand-in chat endpoint at {endpoint.url}", flush=True)
    endpoint.server.serve_forever()


if __name__ == "__main__":
    main()
