"""The HTTP transport's own guards: the home's token file, and the request body's deadline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest

from kope_mcp.app import http_server
from kope_mcp.app.http_server import HttpConfigError, RequestBodyLimit, home_token


def test_the_home_token_is_made_once_private_and_then_reused(tmp_path: Path):
    token, made = home_token(tmp_path)
    assert made and len(token) >= 32
    assert oct((tmp_path / "http-token").stat().st_mode & 0o777) == "0o600"
    assert home_token(tmp_path) == (token, False)


def test_a_home_token_others_can_read_is_refused_with_what_to_do(tmp_path: Path):
    home_token(tmp_path)
    os.chmod(tmp_path / "http-token", 0o644)
    with pytest.raises(HttpConfigError, match="mode 0600"):
        home_token(tmp_path)


def test_a_home_token_that_is_a_link_is_never_followed(tmp_path: Path):
    (tmp_path / "elsewhere").write_text("planted\n")
    (tmp_path / "http-token").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HttpConfigError, match="cannot read"):
        home_token(tmp_path)


def test_a_body_that_trickles_in_past_the_deadline_gets_408(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(http_server, "BODY_DEADLINE_S", 0.3)
    sent: list[dict] = []
    reached_app = False

    async def app(scope, receive, send):
        nonlocal reached_app
        reached_app = True

    async def receive():
        await anyio.sleep(0.1)
        return {"type": "http.request", "body": b"x", "more_body": True}  # never the last chunk

    async def send(message):
        sent.append(message)

    async def body():
        with anyio.fail_after(10):
            await RequestBodyLimit(app, limit=1 << 20, max_source_bytes=1 << 16)(
                {"type": "http", "headers": []}, receive, send)

    anyio.run(body)
    assert not reached_app
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"])["error"]["message"].startswith("request_timeout:")


def test_a_stop_request_ends_the_runs_in_flight_and_arms_an_exit_deadline(monkeypatch: pytest.MonkeyPatch):
    import signal
    import threading

    import uvicorn

    fired, ended = threading.Event(), []
    monkeypatch.setattr(http_server, "STOP_DEADLINE_S", 0.05)
    monkeypatch.setattr(http_server, "_exit_now", fired.set)
    from kope_mcp.runtime import sandbox

    monkeypatch.setattr(sandbox, "end_all_runs", lambda: ended.append(1) or 0)
    server = http_server._stopping_server_class()(uvicorn.Config(app=RequestBodyLimit(None, 1, 1)))
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and ended == [1]
    assert fired.wait(5)  # a shutdown that hangs is ended by the deadline
    server.handle_exit(signal.SIGTERM, None)  # asked again: the runs were ended once, the deadline stands
    assert ended == [1]


@pytest.mark.parametrize(("header", "status"), [
    (b"Bearer s3cret", 200), (b"bearer s3cret", 200), (b"BEARER  s3cret", 200),  # the scheme in any case
    (b"Bearer S3CRET", 401), (b"Basic s3cret", 401), (b"s3cret", 401), (b"", 401),  # the token exactly
])
def test_the_bearer_scheme_is_case_insensitive_the_token_exact_and_a_refusal_names_where_the_token_is(
        header: bytes, status: int):
    sent: list[dict] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    middleware = http_server.BearerTokenAndActivity(app, "s3cret", http_server.Activity(),
                                                    token_source="the token in /etc/kope/token")
    anyio.run(middleware, {"type": "http", "headers": [(b"authorization", header)]}, None, send)
    assert sent[0]["status"] == status
    if status == 401:
        assert "the token in /etc/kope/token" in json.loads(sent[1]["body"])["message"]


@pytest.mark.parametrize("message, says", [
    ([{"jsonrpc": "2.0", "id": 1, "method": "ping"}], "batches are not accepted"),
    ({"id": 3, "method": "tools/list"}, '"jsonrpc": "2.0"'),
    ({"jsonrpc": "1.0", "id": 3, "method": "tools/list"}, '"jsonrpc": "2.0"'),
    ({"jsonrpc": "2.0", "id": 3}, "needs a method"),
    ({"jsonrpc": "2.0", "id": 3, "method": 5}, "a string method"),
    ({"jsonrpc": "2.0", "id": [1], "method": "ping"}, "id is an integer or a string"),
    (7, "a JSON object, not int"),
])
def test_a_post_that_is_json_but_not_one_jsonrpc_message_is_invalid_request_in_one_line(message, says):
    from kope_mcp.app.http_server import JsonRpcEnvelope

    sent: list[dict] = []
    reached_app = False

    async def app(scope, receive, send):
        nonlocal reached_app
        reached_app = True

    chunks = [{"type": "http.request", "body": json.dumps(message).encode(), "more_body": False}]

    async def receive():
        return chunks.pop(0)

    async def send(event):
        sent.append(event)

    anyio.run(lambda: JsonRpcEnvelope(app)({"type": "http", "method": "POST", "headers": []}, receive, send))
    assert not reached_app and sent[0]["status"] == 400
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == -32600 and error["message"].startswith("invalid_request: ") and says in error["message"]
    assert "\n" not in error["message"]


@pytest.mark.parametrize("body", [
    json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode(),
    json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode(),
    json.dumps({"jsonrpc": "2.0", "id": 9, "result": {}}).encode(),
    b"{not json",  # the SDK's own parse error answers this
])
def test_a_valid_message_or_a_parse_error_reaches_the_sdk_with_its_body_intact(body):
    from kope_mcp.app.http_server import JsonRpcEnvelope

    seen: list[bytes] = []

    async def app(scope, receive, send):
        while True:
            event = await receive()
            seen.append(event["body"])
            if not event["more_body"]:
                return

    chunks = [{"type": "http.request", "body": body[:5], "more_body": True},
              {"type": "http.request", "body": body[5:], "more_body": False}]

    async def receive():
        return chunks.pop(0)

    async def send(event):
        raise AssertionError(f"answered: {event}")

    async def run() -> None:
        await JsonRpcEnvelope(app)({"type": "http", "method": "POST", "headers": []}, receive, send)

    anyio.run(run)
    assert b"".join(seen) == body
