"""One KOPE_HOME, many clients: stdio clients share the home's daemon, HTTP clients reach it with its token,
a crashed daemon is replaced, and nothing acknowledged is lost."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import Implementation

from kope_mcp.app import daemon
from kope_mcp.app.http_server import HttpConfigError, HttpOptions
from kope_mcp.memory.store import KuzuExperienceStore
from tests.conftest import VECTOR_ADD_OK
from tests.transports import http_client, stdio

pytestmark = pytest.mark.slow  # a subprocess or a multi-second workflow: not the everyday loop


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "home"
    yield path
    with contextlib.suppress(daemon.DaemonError):
        daemon.stop(path)


async def call(client: Client, tool: str, **args):
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    return result.structured_content


def test_two_stdio_clients_and_an_http_client_share_one_memory_at_once(home):
    async def work(client: Client, name: str) -> None:
        compiled = await call(client, "compile_kernel", task_id="vector_add", source=VECTOR_ADD_OK + f"// {name}\n")
        assert (await call(client, "run_tests", kernel_id=compiled["kernel_id"]))["passed"]
        await call(client, "record_experience", strategy=f"{name} plain loop", kernel_id=compiled["kernel_id"],
                   lesson=f"{name}: the plain vector add loop is correct")

    async def body():
        with anyio.fail_after(180):
            async with Client(stdio(home), client_info=Implementation(name="desktop", version="1")) as a, \
                    Client(stdio(home), client_info=Implementation(name="ide", version="2")) as b:
                async with http_client(home, "script") as c, anyio.create_task_group() as tg:
                    for client, name in ((a, "desktop"), (b, "ide"), (c, "script")):
                        tg.start_soon(work, client, name)
                for client in (a, b):
                    seen = await call(client, "query_experience", query="vector add plain loop",
                                      task_id="vector_add", token_budget=4000)
                    authors = " | ".join(item["why"] for item in seen["items"])
                    assert all(f"by {who}" in authors for who in ("desktop 1", "ide 2", "script 1")), authors

    anyio.run(body)
    state = daemon.running(home)
    assert state is not None and state.on_demand


def test_clients_starting_at_the_same_instant_start_one_daemon(home):
    pids: list[int] = []

    async def one(i: int) -> None:
        async with Client(stdio(home), client_info=Implementation(name=f"c{i}", version="1")) as client:
            # The memory's statistics: the daemon's to answer (the proxy answers the catalogue itself meanwhile).
            assert "counts" in (await client.read_resource("kope://memory/stats")).contents[0].text
            state = daemon.running(home)
            assert state is not None
            pids.append(state.pid)

    async def body():
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(one, i)

    anyio.run(body)
    assert len(set(pids)) == 1


def test_a_stale_state_file_from_a_crashed_daemon_is_replaced(home):
    (home / "daemon").mkdir(parents=True)
    (home / "daemon" / "state.json").write_text(json.dumps(
        {"pid": 999999, "url": "http://127.0.0.1:9", "token": "x", "started_at": 0, "on_demand": True}))
    state = daemon.ensure(home)
    assert state.pid != 999999 and daemon.running(home) == state


def test_kill_9_of_the_daemon_gives_clear_errors_and_a_restart_keeps_every_acknowledged_write(home):
    acknowledged: list[str] = []
    errors: list[str] = []
    killed: list[int] = []

    async def writer(client: Client, name: str) -> None:
        for i in range(30):
            result = await client.call_tool("record_experience", {
                "task_id": "relu", "strategy": f"{name} strategy {i}", "lesson": f"{name} lesson number {i}"})
            if result.is_error:
                errors.append(result.content[0].text)
            else:
                acknowledged.append(result.structured_content["experience_id"])
            if len(acknowledged) == 20 and not killed:
                state = daemon.running(home)
                assert state is not None
                killed.append(state.pid)
                os.kill(state.pid, signal.SIGKILL)

    async def body():
        with anyio.fail_after(240):
            async with Client(stdio(home), client_info=Implementation(name="a", version="1")) as a, \
                    Client(stdio(home), client_info=Implementation(name="b", version="1")) as b, \
                    anyio.create_task_group() as tg:
                tg.start_soon(writer, a, "a")
                tg.start_soon(writer, b, "b")

    anyio.run(body)
    assert killed and len(acknowledged) + len(errors) == 60
    assert all(e.startswith("daemon_unavailable:") for e in errors), errors
    after = daemon.running(home)
    assert after is not None and after.pid != killed[0]  # the next call started a fresh daemon
    daemon.stop(home)
    store = KuzuExperienceStore(home / "memory.kuzu")
    try:
        for experience_id in acknowledged:
            assert store.lesson(experience_id).task_id == "relu"
    finally:
        store.close()


def test_http_refuses_requests_without_the_token_and_non_loopback_without_token_or_hosts(home):
    state = daemon.ensure(home)
    response = httpx2.post(state.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert response.status_code == 401 and "Bearer" in response.json()["message"]
    # It says what kind of token, never where one is kept (the home, its daemon's state file).
    assert str(home) not in response.text and "state.json" not in response.text and state.token not in response.text
    with pytest.raises(HttpConfigError, match="requires a token"):
        HttpOptions(host="0.0.0.0").validate()
    with pytest.raises(HttpConfigError, match="--allowed-host"):
        HttpOptions(host="0.0.0.0", token="t").validate()
    with pytest.raises(HttpConfigError, match="requires a token"):
        HttpOptions(host="127.0.0.1").validate()  # loopback is every user of this machine
    HttpOptions(host="127.0.0.1", token="t").validate()


def test_http_served_without_a_token_makes_one_kept_private_in_the_home(home):
    env = {k: v for k, v in os.environ.items() if k != "KOPE_TOKEN"}
    env |= {"KOPE_HOME": str(home), "KOPE_EMBEDDINGS": "off"}
    for _ in range(2):  # the second start reuses the token its clients were configured with
        server = subprocess.Popen([sys.executable, "-m", "kope_mcp", "serve", "--transport", "http", "--port", "0",
                                   "--log-level", "WARNING"], env=env, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while (state := daemon.running(home)) is None or state.pid != server.pid:
                assert server.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            kept = home / "http-token"
            assert oct(kept.stat().st_mode & 0o777) == "0o600"
            assert state.token and state.token == kept.read_text().strip() and len(state.token) >= 32
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            assert httpx2.post(state.url + "/mcp", json=ping).status_code == 401
            authorised = httpx2.post(state.url + "/mcp", json=ping, headers={
                "Authorization": f"Bearer {state.token}", "Accept": "application/json, text/event-stream"})
            assert authorised.status_code != 401
        finally:
            server.send_signal(signal.SIGTERM)
            _, err = server.communicate(timeout=30)
        assert state.token not in err and str(home / "http-token") in err, err  # where it is, never what


def test_a_request_whose_headers_trickle_in_is_dropped_at_the_header_deadline(home):
    state = daemon.ensure(home)
    host, port = state.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        started = time.monotonic()
        closed = False
        # One header byte every 0.25 s: never a whole request. The server hangs up at HEADER_DEADLINE_S (5 s); the
        # bound leaves a busy machine 10 s more, and stays under the tests' daemon idle exit (20 s), which would
        # otherwise end the connection too.
        while time.monotonic() - started < 15:
            try:
                conn.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            conn.settimeout(0.25)
            try:
                if conn.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed = True
                break
        assert closed, "the connection was still open after 15 s of trickled headers"
    response = httpx2.post(state.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert response.status_code == 401  # the server itself kept serving


def test_a_user_started_http_server_is_the_homes_owner_for_stdio_clients(home, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    env = {**os.environ, "KOPE_HOME": str(home), "KOPE_EMBEDDINGS": "off"}
    server = __import__("subprocess").Popen(
        [sys.executable, "-m", "kope_mcp", "serve", "--transport", "http", "--port", "0", "--token-file",
         str(token_file), "--log-level", "WARNING"], env=env)
    try:
        deadline = time.monotonic() + 60
        while (state := daemon.running(home)) is None:
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert state.token == "s3cret" and not state.on_demand and state.pid == server.pid

        async def body():
            with anyio.fail_after(60):
                async with Client(stdio(home)) as client:
                    assert (await call(client, "list_tasks", family="pooling"))["count"] == 3

        anyio.run(body)
        assert daemon.running(home).pid == server.pid  # the stdio client used it rather than starting another
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert daemon.running(home) is None


def test_memory_commands_work_while_an_on_demand_daemon_owns_the_home(tmp_path, monkeypatch, capsys):
    from kope_mcp.app import daemon
    from kope_mcp.app.cli import main

    home = tmp_path / "home"
    monkeypatch.setenv("KOPE_HOME", str(home))
    state = daemon.ensure(home)
    assert daemon.running(home) is not None
    assert main(["memory", "stats"]) == 0  # read-only: the daemon answers it and keeps serving
    captured = capsys.readouterr()
    assert '"schema_version"' in captured.out and "stopped" not in captured.err
    assert daemon.running(home).pid == state.pid
    assert main(["memory", "export", str(tmp_path / "out.jsonl")]) == 0  # needs the database to itself
    captured = capsys.readouterr()
    assert f"stopped the home's on-demand daemon (pid {state.pid})" in captured.err
    assert daemon.running(home) is None


def test_a_client_whose_settings_differ_from_the_daemons_is_told_first_and_in_every_answers_warnings(
        tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("KOPE_HOME", str(home))
    monkeypatch.delenv("KOPE_MAX_SOURCE_BYTES", raising=False)
    daemon.ensure(home)  # started with the default settings
    env = {**os.environ, "KOPE_HOME": str(home), "KOPE_MAX_SOURCE_BYTES": "1000"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve", "--log-level", "ERROR"],
                                   env=env)

    async def body():
        with anyio.fail_after(60):
            async with Client(params) as client:
                first = await client.call_tool("list_tasks", {"family": "matmul"})
                texts = [c.text for c in first.content if c.type == "text"]
                assert any("KOPE_MAX_SOURCE_BYTES=1000 (the daemon uses 262144)" in t and "--no-daemon" in t
                           for t in texts), texts
                second = await client.call_tool("list_tasks", {"family": "matmul"})
                assert not any("KOPE_MAX_SOURCE_BYTES" in c.text for c in second.content if c.type == "text")
                later = await client.call_tool("compile_kernel", {"task_id": "vector_add", "source": VECTOR_ADD_OK})
                assert any("KOPE_MAX_SOURCE_BYTES=1000" in w for w in later.structured_content["warnings"])
    try:
        anyio.run(body)
    finally:
        daemon.stop(home)


def test_a_task_added_while_the_daemon_serves_is_served_by_that_daemon_without_a_restart(home, monkeypatch, capsys):
    from kope_mcp.app.cli import main

    example = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "axpby"
    monkeypatch.setenv("KOPE_HOME", str(home))

    async def body():
        with anyio.fail_after(120):
            async with Client(stdio(home)) as client:
                assert (await client.call_tool("get_task", {"task_id": "axpby"})).is_error
                owner = daemon.running(home)
                assert owner is not None
                assert await anyio.to_thread.run_sync(main, ["tasks", "add", str(example)]) == 0
                with anyio.fail_after(10):  # the daemon looks at the task folders at most once a second
                    while (found := await client.call_tool("get_task", {"task_id": "axpby"})).is_error:
                        await anyio.sleep(0.1)
                assert found.structured_content["id"] == "axpby"
                assert daemon.running(home).pid == owner.pid

    anyio.run(body)
    assert "serve it from their next call" in capsys.readouterr().out


def _profile_beside(home: Path, monkeypatch, admin: list[str]) -> tuple[daemon.DaemonState, object, float]:
    """Start the home's daemon, profile a kernel through it and run the `kope` admin command beside it once the
    profile is under way: the daemon, the profile's answer, and how long the admin command took."""
    from kope_mcp.app.cli import main

    monkeypatch.setenv("KOPE_HOME", str(home))
    monkeypatch.setenv("KOPE_EMBEDDINGS", "off")
    monkeypatch.setenv("KOPE_PROFILE_S", "6")  # long enough that the command lands inside the measurement
    state = daemon.ensure(home)
    said: dict[str, object] = {}

    async def body():
        async with http_client(home, "agent") as client:
            compiled = await call(client, "compile_kernel", task_id="vector_add", source=VECTOR_ADD_OK)
            await call(client, "run_tests", kernel_id=compiled["kernel_id"])

            measuring = anyio.Event()

            async def progressed(done: float, total: float | None, message: str | None) -> None:
                if message and message.startswith("measuring"):
                    measuring.set()

            async def profile():
                said["profile"] = await client.call_tool("profile_kernel", {"kernel_id": compiled["kernel_id"]},
                                                         progress_callback=progressed)

            async with anyio.create_task_group() as tg:
                tg.start_soon(profile)
                with anyio.fail_after(120):
                    await measuring.wait()
                await anyio.sleep(1.0)  # inside the measurement (a 6 s cap)
                start = time.monotonic()
                said["rc"] = await anyio.to_thread.run_sync(main, admin)
                said["admin_s"] = time.monotonic() - start

    anyio.run(body)
    assert said["rc"] == 0
    return state, said["profile"], float(said["admin_s"])


def test_memory_stats_beside_a_running_profile_is_answered_by_the_daemon_which_keeps_serving(home, monkeypatch,
                                                                                            capsys):
    state, profile, _ = _profile_beside(home, monkeypatch, ["memory", "stats"])
    assert not profile.is_error, profile.content
    assert profile.structured_content["failure"] is None
    assert '"schema_version"' in capsys.readouterr().out
    assert daemon.running(home).pid == state.pid  # the same daemon, never stopped


def test_a_daemon_stopped_during_a_profile_ends_it_with_one_clear_error_and_the_next_call_is_served(home,
                                                                                                   monkeypatch):
    state, profile, stop_s = _profile_beside(home, monkeypatch, ["daemon", "stop"])
    assert profile.is_error and profile.content[0].text.startswith("server_stopping:"), profile.content
    assert stop_s < 15, stop_s  # the run in flight is ended, not waited for
    assert not daemon._owner_alive(home)

    async def next_call():
        async with http_client(home, "next") as client:
            return await call(client, "list_tasks")

    start = time.monotonic()
    assert anyio.run(next_call)["tasks"]
    assert time.monotonic() - start < 30 and daemon.running(home).pid != state.pid
    # Nothing of the ended run was recorded as the kernel's outcome.
    daemon.stop(home)
    store = KuzuExperienceStore(home / "memory.kuzu")
    try:
        assert all(a.speedup is None and a.label != "incorrect" for a in store.all_attempts())
    finally:
        store.close()


def test_a_long_stdio_session_keeps_only_its_unanswered_requests(home, monkeypatch):
    # The proxy's one session to the daemon served thousands of calls; it used to keep every one (arguments and
    # result) until the session ended.
    from types import SimpleNamespace

    from kope_mcp.app.proxy import OwnerLink

    monkeypatch.setenv("KOPE_EMBEDDINGS", "off")
    link = OwnerLink(home)
    ctx = SimpleNamespace(meta={"io.modelcontextprotocol/clientInfo": {"name": "long-session", "version": "1"}},
                          session=None)
    sizes: list[int] = []

    async def body() -> None:
        with anyio.fail_after(600):
            async with anyio.create_task_group() as tg:
                tg.start_soon(link.run)
                for _ in range(40):
                    async with anyio.create_task_group() as calls:
                        for _ in range(50):  # 50 at once, as concurrent as a busy client gets
                            calls.start_soon(link.request, ctx, lambda c: c.list_tools())
                    sizes.append(len(link.in_flight))
                tg.cancel_scope.cancel()

    anyio.run(body)
    assert len(sizes) == 40 and max(sizes) <= 2 * 50 + 64, sizes  # 2,000 calls answered, a bounded list kept
