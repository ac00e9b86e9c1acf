"""A dropped HTTP event stream resumes: a client that loses its connection in the middle of a profile reconnects
with Last-Event-ID and gets the rest of the call (its progress and its answer); another session cannot read it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from kope_mcp.app import daemon
from tests.e2e.test_cancelled_calls import SLOW_RELU
from tests.transports import http_client

pytestmark = pytest.mark.slow  # a subprocess daemon

VERSION = "2025-11-25"  # the first protocol version whose streams the SDK primes with an event id


def events(response: Any) -> Iterator[tuple[str | None, dict[str, Any] | None]]:
    """(event id, JSON-RPC message or None for a priming event) for each server-sent event, as they arrive."""
    ident, data = None, []
    for line in response.iter_lines():
        if line.startswith("id:"):
            ident = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "":
            if ident is not None or data:
                text = "\n".join(data)
                yield ident, (json.loads(text) if text else None)
            ident, data = None, []


class Session:
    def __init__(self, web: Any, url: str, token: str) -> None:
        self.web, self.url = web, url
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": VERSION}
        opened = web.post(url, headers=self.headers, content=json.dumps({
            "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "resuming", "version": "1"}}}))
        assert opened.status_code == 200, opened.text
        self.headers["mcp-session-id"] = opened.headers["mcp-session-id"]
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        web.post(url, headers=self.headers, content=json.dumps(initialized))

    def stream(self, request_id: int, tool: str, arguments: dict[str, Any]) -> Any:
        body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                "params": {"name": tool, "arguments": arguments, "_meta": {"progressToken": f"p{request_id}"}}}
        return self.web.stream("POST", self.url, headers=self.headers, content=json.dumps(body))

    def resume(self, last_event_id: str, headers: dict[str, str] | None = None) -> Any:
        return self.web.stream("GET", self.url, headers={**(headers or self.headers), "Last-Event-ID": last_event_id,
                                                          "Accept": "text/event-stream"})


def test_a_profile_whose_stream_dropped_is_resumed_with_its_progress_and_answer_for_its_session_only(tmp_path,
                                                                                                     monkeypatch):
    import httpx2 as httpx

    home = tmp_path / "home"
    monkeypatch.setenv("KOPE_PROFILE_S", "4")
    monkeypatch.setenv("KOPE_EMBEDDINGS", "off")

    async def prepared() -> str:
        from tests.e2e.test_cancelled_calls import passing_kernel

        async with http_client(home, "preparing") as client:
            return await passing_kernel(client, SLOW_RELU)

    kernel = anyio.run(prepared)
    state = daemon.ensure(home)
    assert state.token
    try:
        with httpx.Client(timeout=httpx.Timeout(120, connect=10)) as web:
            mine = Session(web, state.url + "/mcp", state.token)
            last: str | None = None
            with mine.stream(7, "profile_kernel", {"kernel_id": kernel, "time_reference": False}) as response:
                assert response.status_code == 200
                for ident, message in events(response):
                    last = ident or last
                    if message and str(message.get("params", {}).get("message", "")).startswith("measuring"):
                        break  # and the connection drops here, mid-measurement
            assert last is not None, "the stream carried no event ids: nothing to resume from"

            other = Session(web, state.url + "/mcp", state.token)
            leaked: list[Any] = []
            with contextlib.suppress(httpx.ReadTimeout), web.stream(
                    "GET", state.url + "/mcp", timeout=httpx.Timeout(3, connect=10),
                    headers={**other.headers, "Last-Event-ID": last, "Accept": "text/event-stream"}) as response:
                for _, message in events(response):
                    if message and message.get("id") == 7:
                        leaked.append(message)
                        break
            assert not leaked, "another session read this session's answer"

            replayed: list[dict[str, Any]] = []
            with mine.resume(last) as response:
                assert response.status_code == 200, response.read()
                for _, message in events(response):
                    if message is not None:
                        replayed.append(message)
                        if message.get("id") == 7:
                            break
        answer = replayed[-1]
        assert answer.get("id") == 7 and "result" in answer, replayed
        profile = answer["result"]["structuredContent"]
        assert profile["failure"] is None and profile["speedup_vs_baseline"] is not None, profile
        progress = [m["params"]["progress"] for m in replayed if m.get("method") == "notifications/progress"]
        assert progress == sorted(progress)
    finally:
        with contextlib.suppress(daemon.DaemonError):
            daemon.stop(home)
