"""tools/llm_agent.py against a local stand-in chat endpoint that replays canned answers: the loop, the tool
calls, the injected experience and the error handling, without a model."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from argparse import Namespace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("llm_agent", ROOT / "tools" / "llm_agent.py")
assert spec is not None and spec.loader is not None
llm_agent = importlib.util.module_from_spec(spec)
spec.loader.exec_module(llm_agent)

VECTOR_ADD = ("#include <stdint.h>\nvoid kernel(const float *a, const float *b, float *out, int64_t n) {\n"
              "    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];\n}\n")


def tool_call(call_id: str, name: str, arguments: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


class StandIn:
    """Serves /v1/chat/completions from a script: each answer may refer to earlier tool results."""

    def __init__(self, script: list) -> None:
        self.script, self.requests = list(script), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                step = outer.script.pop(0)
                if step == 503:
                    self.send_response(503)
                    self.end_headers()
                    self.wfile.write(b"busy")
                    return
                message = step(body) if callable(step) else step
                data = json.dumps({"choices": [{"message": message}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


def last_tool_result(body: dict) -> dict:
    return json.loads(next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool"))


def args(url: str, home: Path, **overrides) -> Namespace:
    base = dict(base_url=url, model="stand-in", api_key_env="", task="vector_add", attempts=2, iterations=3,
                max_tool_calls=6, token_budget=800,
                server=f"{sys.executable} -m kope_mcp serve --no-daemon --log-level WARNING")
    return Namespace(**{**base, **overrides})


@pytest.mark.slow
def test_the_loop_calls_tools_feeds_back_errors_and_injects_experience(tmp_path, monkeypatch):
    monkeypatch.setenv("KOPE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KOPE_EMBEDDINGS", "off")
    monkeypatch.setenv("KOPE_PROFILE_S", "0.2")
    stand_in = StandIn([
        503,  # the endpoint is busy once: retried
        tool_call("c1", "compile_kernel", json.dumps({"task_id": "vector_add", "source": VECTOR_ADD})),
        lambda body: tool_call("c2", "run_tests", json.dumps({"kernel_id": last_tool_result(body)["kernel_id"]})),
        lambda body: tool_call("c3", "profile_kernel", json.dumps({"kernel_id": last_tool_result(body)["kernel_id"]})),
        tool_call("c4", "compile_kernel", "{not json"),  # malformed: goes back to the model as an error
        tool_call("c5", "no_such_tool", "{}"),
        {"role": "assistant", "content": "DONE"},
    ])
    summary = anyio.run(llm_agent.run, args(stand_in.url, tmp_path))
    assert summary["stopped"] == "model said DONE"
    assert summary["compiles"] == 1 and summary["tool_calls"] == 5 and summary["tool_errors"] == 2
    assert summary["best_speedup"] is not None and summary["best_speedup"] > 0
    first = stand_in.requests[0]
    assert {t["function"]["name"] for t in first["tools"]} >= {"compile_kernel", "run_tests", "query_experience"}
    assert any("Relevant experience (kope-mcp memory)" in str(m["content"]) for m in first["messages"])
    tool_results = [m["content"] for m in stand_in.requests[-1]["messages"] if m["role"] == "tool"]
    assert any("not valid JSON" in text for text in tool_results)
    assert any("no tool named 'no_such_tool'" in text for text in tool_results)


def test_an_endpoint_that_keeps_failing_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("KOPE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KOPE_EMBEDDINGS", "off")
    monkeypatch.setattr(llm_agent.time, "sleep", lambda s: None)
    stand_in = StandIn([503, 503, 503])
    with pytest.raises(llm_agent.EndpointError, match="HTTP 503"):
        anyio.run(llm_agent.run, args(stand_in.url, tmp_path))
