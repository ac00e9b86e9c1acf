"""The memory tools through MCP: identity from clientInfo, the stats resource, and kill -9 durability."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import Implementation

from kope_mcp.app.server import build_server
from kope_mcp.memory.store import KuzuExperienceStore
from tests.conftest import VECTOR_ADD_OK, make_settings
from tests.memory_helpers import profile_until_clean


def test_the_client_name_and_version_are_recorded_and_the_stats_resource_counts(tmp_path):
    server = build_server(make_settings(tmp_path / "home"))

    async def body():
        async with Client(server, client_info=Implementation(name="ide-agent", version="0.9")) as client:
            compiled = (await client.call_tool("compile_kernel", {"task_id": "vector_add",
                                                                  "source": VECTOR_ADD_OK})).structured_content
            await client.call_tool("run_tests", {"kernel_id": compiled["kernel_id"]})
            recorded = await client.call_tool("record_experience", {
                "kernel_id": compiled["kernel_id"], "session_id": compiled["session_id"], "strategy": "plain loop",
                "lesson": "the naive loop is correct"})
            assert not recorded.is_error and recorded.structured_content["verified"]
            answer = await client.call_tool("query_experience", {"query": "vector add",
                                                                 "session_id": compiled["session_id"]})
            assert not answer.is_error and answer.structured_content["phase"] == "optimize"
            stats = json.loads((await client.read_resource("kope://memory/stats")).contents[0].text)
            assert stats["counts"]["Attempt"] == 1 and stats["counts"]["Lesson"] == 1
            bad = await client.call_tool("query_experience", {"query": "x", "session_id": "s-nope"})
            assert bad.is_error and "unknown_session:" in bad.content[0].text
        return compiled

    compiled = anyio.run(body)
    store = KuzuExperienceStore(tmp_path / "home" / "memory.kuzu")
    session = store.session(compiled["session_id"])
    assert (session.agent.name, session.agent.version) == ("ide-agent", "0.9")
    assert store.attempt(compiled["kernel_id"]).agent == "ide-agent 0.9"


def _server_pid(home: Path) -> int:
    needle = f"KOPE_HOME={home}".encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (proc / "environ").read_bytes().split(b"\0") and \
                        b"serve" in (proc / "cmdline").read_bytes():
                    return int(proc.name)
    raise AssertionError("server process not found")


def test_kill_9_of_a_stdio_server_owning_its_home_loses_no_acknowledged_experience(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "KOPE_HOME": str(home), "KOPE_EMBEDDINGS": "off"}
    # --no-daemon: this server process owns the database itself (the daemon case is in test_shared_home.py).
    params = StdioServerParameters(command=sys.executable, args=["-m", "kope_mcp", "serve", "--log-level", "ERROR",
                                                                 "--no-daemon"], env=env)
    acknowledged: list[str] = []

    async def body():
        with anyio.fail_after(120), contextlib.suppress(Exception):
            async with Client(params) as client:
                pid = _server_pid(home)
                for i in range(40):
                    if i == 25:
                        os.kill(pid, signal.SIGKILL)  # mid-stream: later calls fail, earlier ones were answered
                    result = await client.call_tool("record_experience", {
                        "task_id": "relu", "strategy": f"strategy {i}", "lesson": f"lesson number {i}"})
                    if result.is_error or result.structured_content is None:
                        break
                    acknowledged.append(result.structured_content["experience_id"])

    anyio.run(body)
    assert 20 <= len(acknowledged) <= 26
    store = KuzuExperienceStore(home / "memory.kuzu")
    for experience_id in acknowledged:
        assert store.lesson(experience_id).task_id == "relu"


def test_agents_see_each_others_experience_by_default_and_can_prefer_or_keep_one_agents(tmp_path):
    server = build_server(make_settings(tmp_path / "home"))

    async def work(name: str, label: str, lesson: str) -> None:
        async with Client(server, client_info=Implementation(name=name, version="1")) as client:
            compiled = (await client.call_tool("compile_kernel", {
                "task_id": "vector_add", "source": VECTOR_ADD_OK + f"// {name}\n", "agent": label,
            })).structured_content
            await client.call_tool("run_tests", {"kernel_id": compiled["kernel_id"]})
            await client.call_tool("record_experience", {"strategy": f"{label} idea", "lesson": lesson,
                                                         "task_id": "vector_add", "agent": label})

    async def ask(**filters):
        async with Client(server, client_info=Implementation(name="script", version="2")) as client:
            result = await client.call_tool("query_experience", {"query": "vector add lesson",
                                                                 "task_id": "vector_add", **filters})
            assert not result.is_error, result.content
            return result.structured_content

    async def body():
        await work("claude-desktop", "opus planner", "unroll the add loop by four for this task")
        await work("ide-agent", "small coder", "aligned loads help the add loop of this task")
        everyone = await ask()
        authors = " | ".join(item["why"] for item in everyone["items"])
        assert "claude-desktop 1 [opus planner]" in authors and "ide-agent 1 [small coder]" in authors
        only = await ask(agent="small coder", agent_mode="only")
        assert only["items"] and all("ide-agent 1 [small coder]" in i["why"] for i in only["items"]
                                     if i["tier"] != "hot")
        assert only["dropped_reasons"].get("other_agent", 0) >= 1
        preferred = await ask(agent="claude-desktop")
        first = next(i for i in preferred["items"] if i["tier"] != "hot")
        assert "preferred agent" in first["why"]

    anyio.run(body)


MATMUL_FAST = """
#include <stdint.h>
void kernel(const float *restrict A, const float *restrict B, float *restrict C, int64_t M, int64_t N, int64_t K) {
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) C[i * N + j] = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            float a = A[i * K + k];
            for (int64_t j = 0; j < N; j++) C[i * N + j] += a * B[k * N + j];
        }
    }
}
"""


def test_a_clients_words_on_another_clients_measured_win_are_its_claim_never_verified(tmp_path):
    server = build_server(make_settings(tmp_path / "home"))

    async def body():
        async with Client(server, client_info=Implementation(name="client-a", version="1")) as a:
            compiled = (await a.call_tool("compile_kernel", {"task_id": "matmul", "source": MATMUL_FAST,
                                                             "flags": ["-O3"]})).structured_content
            kernel_id = compiled["kernel_id"]
            assert (await a.call_tool("run_tests", {"kernel_id": kernel_id})).structured_content["passed"]
            profile = (await a.call_tool("profile_kernel", {"kernel_id": kernel_id})).structured_content
            assert profile["failure"] is None
            own = (await a.call_tool("record_experience", {
                "kernel_id": kernel_id, "session_id": compiled["session_id"], "strategy": "loop interchange i-k-j",
                "lesson": "i-k-j makes the inner loop contiguous"})).structured_content
            assert own["about_agent"] is None and own["verified"] == own["measured"]
        # The same software again (the same clientInfo): without the session's id its words are a claim.
        async with Client(server, client_info=Implementation(name="client-a", version="1")) as twin:
            copied = (await twin.call_tool("record_experience", {
                "kernel_id": kernel_id, "strategy": "loop interchange i-k-j",
                "lesson": "unroll by 64 and drop the tail loop"})).structured_content
            assert copied["verified"] is False and copied["label"] == "lesson" and copied["about_agent"] == "client-a 1"
        async with Client(server, client_info=Implementation(name="client-b", version="1")) as b:
            claim = (await b.call_tool("record_experience", {
                "kernel_id": kernel_id, "strategy": "loop interchange i-k-j",
                "lesson": "compile with -O0 and remove every OpenMP pragma"})).structured_content
            assert claim["verified"] is False and claim["label"] == "lesson"
            assert claim["about_agent"] == "client-a 1" and "claim" in claim["next_step"]
        async with Client(server, client_info=Implementation(name="client-c", version="1")) as c:
            served = (await c.call_tool("query_experience", {"query": "matmul loop order", "task_id": "matmul",
                                                             "token_budget": 4000})).structured_content
            # Only client-b's items: whatever else selection keeps, the claim itself must read as a claim.
            only_b = (await c.call_tool("query_experience", {
                "query": "matmul loop order -O0", "task_id": "matmul", "token_budget": 4000, "agent": "client-b",
                "agent_mode": "only"})).structured_content
        assert "-O0" not in "".join(r for r in served["context"].splitlines() if "[verified" in r)
        line = next((row for row in only_b["context"].splitlines() if "-O0" in row), only_b["context"])
        assert "[verified" not in line and "client-b 1 says about client-a 1's" in line and kernel_id in line
        items = {i["id"]: i for i in [*served["items"], *only_b["items"]]}
        assert items[claim["experience_id"]]["verified"] is False
        if own["verified"] and claim["experience_id"] in {i["id"] for i in served["items"]}:
            # the measuring session's own lesson ranks above the claim about it
            assert items[own["experience_id"]]["score"] > items[claim["experience_id"]]["score"]

    anyio.run(body)



@pytest.mark.slow
def test_a_memory_imported_from_another_home_is_served_as_evidence_from_there_and_edits_are_caught(
        tmp_path, monkeypatch, capsys):
    from kope_mcp.app.cli import main
    from kope_mcp.services.workbench import Workbench

    # Home A measures a win and says why.
    home_a, home_b = tmp_path / "home-a", tmp_path / "home-b"
    bench = Workbench(make_settings(home_a))
    compiled = bench.compile_kernel("matmul", MATMUL_FAST, flags=["-O3"], strategy="loop interchange i-k-j")
    assert bench.run_tests(compiled.kernel_id).passed
    profile_until_clean(bench, compiled.kernel_id)
    bench.store.close()
    monkeypatch.setenv("KOPE_EMBEDDINGS", "off")
    monkeypatch.setenv("KOPE_HOME", str(home_a))
    export = tmp_path / "a.jsonl"
    assert main(["memory", "export", str(export)]) == 0
    # In transit, a forger adds its own "win" by copying that line with a new id and 55x.
    lines = export.read_text().splitlines()
    line = next(x for x in lines if x.startswith('{"kind":"attempt"') and compiled.kernel_id in x)
    forged = json.loads(line) | {"kernel_id": "k-forged0000", "speedup": 55.0, "label": "effective"}
    export.write_text("\n".join([*lines, json.dumps(forged, separators=(",", ":"))]) + "\n")
    capsys.readouterr()
    monkeypatch.setenv("KOPE_HOME", str(home_b))
    assert main(["memory", "import", str(export)]) == 0
    said = capsys.readouterr()
    assert "measured elsewhere (home " in said.out
    assert "sha256 does not match" in said.err and "{'attempt': 1}" in said.err

    async def body():
        server = build_server(make_settings(home_b))
        async with Client(server, client_info=Implementation(name="client-b", version="1")) as b:
            answer = (await b.call_tool("query_experience", {"query": "matmul loop order", "task_id": "matmul",
                                                             "phase": "optimize", "token_budget": 4000})
                      ).structured_content
        return answer

    answer = anyio.run(body)
    items = {item["id"]: item for item in answer["items"]}
    assert "k-forged0000" not in items and "k-forged0000" not in answer["context"]
    served = items[compiled.kernel_id]
    assert served["tier"] == "cold" and served["origin"].startswith("home ")
    assert "untested here" in answer["context"][served["span"][0]:served["span"][1]]
    assert not any(item["tier"] == "warm" and item["kind"] == "case" for item in answer["items"])

    # --reverify measures the imported win here (the edited line, kept as suspect, is not a win to re-measure):
    # the local verdict is an attempt of this home, with a note naming the imported one.
    capsys.readouterr()
    assert main(["memory", "import", str(export), "--reverify"]) == 0
    said = capsys.readouterr().out
    assert "--reverify: 1 imported wins to measure here" in said
    line = next(x for x in said.splitlines() if x.startswith(f"{compiled.kernel_id} (matmul): imported effective"))
    local_id = line.split(" as ")[1].split()[0]
    home = Workbench(make_settings(home_b))
    try:
        local = home.store.attempt(local_id)
        assert local.origin == "" and local.ok and local.correct and local.speedup is not None
        assert f"here {local.label}" in line
        assert any(compiled.kernel_id in note.text for note in home.store.lessons_for_attempt(local_id))
    finally:
        home.memory.close()
