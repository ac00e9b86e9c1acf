"""The LLM loop (kope_mcp/bench/llm.py, `kope bench --agent llm`, tools/llm_agent.py) against local stand-in
chat endpoints: one that replays canned answers, and the stand-in agent of kope_mcp/bench/stand_in.py."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from kope_mcp.app.cli import main as kope_main
from kope_mcp.bench import llm
from kope_mcp.bench.agent import TaskRun
from kope_mcp.bench.llm import EndpointError, LlmSettings, chat, parse_arguments
from kope_mcp.bench.llm_episode import run_llm_arm
from kope_mcp.bench.stand_in import StandInEndpoint, prompt_tokens

VECTOR_ADD = ("#include <stdint.h>\nvoid kernel(const float *a, const float *b, float *out, int64_t n) {\n"
              "    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];\n}\n")
USAGE = {"prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050}


def tool_call(call_id: str, name: str, arguments: Any) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


class Replay:
    """Serves /v1/chat/completions from a script of answers, status codes or (status, headers, body)."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                step = outer.script.pop(0)
                if isinstance(step, int):
                    step = (step, {}, b"busy")
                if isinstance(step, tuple):
                    status, headers, data = step
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                    return
                message = step(body) if callable(step) else step
                data = json.dumps({"choices": [{"message": message}], "usage": USAGE}).encode()
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


def run_one(url: str, home: Path, arm: str = "active@32k", budget: int = 2, **settings: Any) -> TaskRun:
    params = StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve", "--no-daemon",
                                                                 "--log-level", "WARNING"],
                                   env={**__import__("os").environ, "KOPE_HOME": str(home),
                                        "KOPE_EMBEDDINGS": "off", "KOPE_PROFILE_S": "0.2"})
    config = LlmSettings(base_url=url, model="stand-in", **{"iterations": 3, **settings})

    async def go() -> TaskRun:
        async with Client(params) as client:
            return await run_llm_arm(client, config, "vector_add", arm, budget, seed=0)
    return anyio.run(go)


@pytest.mark.slow
def test_the_loop_calls_tools_feeds_back_errors_injects_experience_and_counts_usage(tmp_path):
    stand_in = Replay([
        503,  # the endpoint is busy once: retried
        tool_call("c1", "compile_kernel", json.dumps({"task_id": "vector_add", "source": VECTOR_ADD})),
        lambda body: tool_call("c2", "run_tests", {"kernel_id": last_tool_result(body)["kernel_id"]}),  # an object
        lambda body: tool_call("c3", "profile_kernel", json.dumps({"kernel_id": last_tool_result(body)["kernel_id"]})),
        tool_call("c4", "compile_kernel", "{not json"),  # malformed: goes back to the model as an error
        tool_call("c5", "no_such_tool", "{}"),
        {"role": "assistant", "content": "DONE"},  # words end nothing: the next iteration asks again
        tool_call("c6", "finish", "{}"),
    ])
    run = run_one(stand_in.url, tmp_path / "home")
    assert run.stopped == "finish"
    assert run.attempts == 1 and run.tool_calls == 4 and run.tool_errors == 2
    assert run.first_correct == 1 and run.best_by_attempt and run.kept[0][0] == 0
    assert run.model_calls == 7 and run.prompt_tokens == 7000 and run.completion_tokens == 350
    first = stand_in.requests[0]
    assert {t["function"]["name"] for t in first["tools"]} >= {"compile_kernel", "run_tests", "query_experience"}
    assert any("Relevant experience (kope-mcp memory)" in str(m["content"]) for m in first["messages"])
    tool_results = [m["content"] for m in stand_in.requests[-1]["messages"] if m["role"] == "tool"]
    assert any("not a JSON object" in text for text in tool_results)
    assert any("no tool named 'no_such_tool'" in text for text in tool_results)
    assert not any("error" in text[:10] for text in tool_results[:3])  # the object arguments were accepted


@pytest.mark.slow
def test_without_memory_nothing_is_injected(tmp_path):
    stand_in = Replay([tool_call("c1", "finish", "{}")])
    run = run_one(stand_in.url, tmp_path / "home", arm="none")
    assert run.context_tokens == 0
    assert not any("experience" in str(m["content"]).lower() for m in stand_in.requests[0]["messages"][2:])


@pytest.mark.slow
def test_a_context_length_answer_gets_the_chat_trimmed_until_it_fits_and_never_ends_the_run(tmp_path):
    too_long = (400, {"Content-Type": "application/json"},
                b'{"error": {"message": "This model\'s maximum context length is 4096 tokens", '
                b'"code": "context_length_exceeded"}}')
    stand_in = Replay([too_long, too_long, tool_call("c1", "finish", "{}")])
    run = run_one(stand_in.url, tmp_path / "home", arm="active@32k")
    assert run.trimmed_retries == 2 and run.stopped == "finish"
    assert "dropped to fit" in str(stand_in.requests[2]["messages"][-1]["content"])
    never = Replay([too_long] * 10)
    run = run_one(never.url, tmp_path / "home2", arm="active@8k")
    assert run.stopped == "context limit" and run.attempts == 0  # the task ends; nothing is raised


@pytest.mark.slow
def test_the_windows_budget_counts_the_tool_schemas_and_usage_includes_them(tmp_path):
    endpoint = StandInEndpoint(max_context=200_000).start()
    try:
        run = run_one(endpoint.url, tmp_path / "home", arm="passive@8k", budget=1)
    finally:
        endpoint.close()
    # The stand-in counts the tools' schemas into prompt_tokens, as a served model does; the chat leaves them room.
    first = endpoint.requests[0]
    schema_share = prompt_tokens(first["messages"], first["tools"]) - prompt_tokens(first["messages"])
    assert schema_share > 500
    assert run.prompt_tokens >= run.model_calls * schema_share
    assert run.peak_tokens <= 8_000 - schema_share and run.stopped == "finish"


def test_only_429_and_5xx_are_retried_and_retry_after_is_honoured(monkeypatch):
    slept: list[float] = []
    stand_in = Replay([(429, {"Retry-After": "3"}, b"slow down"), 502, {"role": "assistant", "content": "hi"}])
    answer = chat(stand_in.url, "m", None, [{"role": "user", "content": "x"}], [], 10, sleep=slept.append)
    assert answer["choices"][0]["message"]["content"] == "hi" and slept == [3.0, 2.0]
    refused = Replay([(401, {}, b"bad key")])
    with pytest.raises(EndpointError, match="refused the request: HTTP 401"):
        chat(refused.url, "m", None, [{"role": "user", "content": "x"}], [], 10, sleep=slept.append)
    assert len(refused.requests) == 1


def test_an_endpoint_that_keeps_failing_is_reported_after_its_retries():
    stand_in = Replay([503] * (llm.RETRIES + 1))
    with pytest.raises(EndpointError, match=r"kept failing.*HTTP 503"):
        chat(stand_in.url, "m", None, [{"role": "user", "content": "x"}], [], 10, sleep=lambda s: None)
    assert len(stand_in.requests) == llm.RETRIES + 1


def test_a_timeout_is_reported_and_not_resent(monkeypatch):
    monkeypatch.setattr(llm, "BASE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(llm, "TIMEOUT_S_PER_1K_PROMPT", 0.0)
    slow = StandInEndpoint(delay_s=1.0).start()
    try:
        with pytest.raises(EndpointError, match="did not answer within"):
            chat(slow.url, "m", None, [{"role": "user", "content": "x"}], [], 10)
        assert len(slow.requests) == 1
    finally:
        slow.close()


@pytest.mark.parametrize("raw, expected", [('{"a": 1}', {"a": 1}), ({"a": 1}, {"a": 1}), ("", {}), (None, {})])
def test_tool_arguments_come_as_a_string_or_an_object(raw, expected):
    assert parse_arguments(raw) == expected


@pytest.mark.parametrize("raw", ["[1, 2]", "{oops"])
def test_arguments_that_are_not_an_object_are_refused(raw):
    with pytest.raises(ValueError):
        parse_arguments(raw)


@pytest.mark.slow
def test_kope_bench_agent_llm_runs_the_scripted_protocol_and_writes_the_same_report_layout(tmp_path, capsys):
    endpoint = StandInEndpoint(max_context=64_000, object_arguments=True).start()
    try:
        code = kope_main(["bench", "--agent", "llm", "--base-url", endpoint.url, "--model", "stand-in", "--quick",
                          "--families", "activation", "--out", str(tmp_path / "out")])
    finally:
        endpoint.close()
    assert code == 0
    (seed,) = json.loads((tmp_path / "out" / "results.json").read_text())
    arms = {"none", "static", "oracle", "aa@8k", "shuffled@8k", "passive@8k", "active@8k"}
    assert set(seed["runs"]) == arms
    for arm, runs in seed["runs"].items():
        assert runs and all(r["prompt_tokens"] > 0 and r["attempts"] >= 1 for r in runs), arm
        assert all(r["stopped"] == "finish" and len(r["judged"]) == r["attempts"] for r in runs), arm
    assert seed["runs"]["none"][0]["context_tokens"] == 0 < seed["runs"]["active@8k"][0]["context_tokens"]
    report = (tmp_path / "out" / "report.md").read_text()
    for section in ("## Design and power", "## Primary", "## A/A control", "## Secondary", "## Verdicts met"):
        assert section in report, section
    assert all(f"| {arm} |" in report for arm in arms)


def test_kope_bench_agent_llm_without_an_endpoint_says_what_it_needs(capsys):
    assert kope_main(["bench", "--agent", "llm", "--quick"]) == 2
    assert "--base-url" in capsys.readouterr().err



def test_the_estimate_is_printed_without_an_endpoint_and_a_budget_below_it_refuses_to_start(capsys):
    assert kope_main(["bench", "--agent", "llm", "--quick", "--estimate"]) == 0
    said = capsys.readouterr().err
    assert said.startswith("estimate: ") and "passive@8k" in said and "active@8k" in said
    total = int(said.split()[1].replace(",", ""))
    assert kope_main(["bench", "--agent", "llm", "--quick", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                      "--max-tokens", str(total // 2)]) == 2
    assert f"is over --max-tokens {total // 2:,}" in capsys.readouterr().err
