"""The raw stdio wire of `kope serve`, as a client that sends unusual bytes sees it."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a subprocess server


def test_a_lone_surrogate_and_malformed_lines_are_answered_and_the_server_keeps_serving(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "kope_mcp", "serve", "--no-daemon", "--log-level", "WARNING"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**os.environ, "KOPE_HOME": str(tmp_path / "home"), "KOPE_EMBEDDINGS": "off"})
    assert proc.stdin is not None and proc.stdout is not None

    def send(text: str) -> None:
        proc.stdin.write(text.encode() + b"\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    def answer() -> dict:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "no answer within 60 s"
        return json.loads(proc.stdout.readline())  # type: ignore[union-attr]

    try:
        send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "wire", "version": "1"}}}))
        assert answer()["id"] == 1
        send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        send('{"jsonrpc": "2.0", "id": 2, "method": "tools/call", '
             '"params": {"name": "get_task", "arguments": {"task_id": "\\ud800"}}}')
        refused = answer()
        assert refused["id"] == 2 and refused["result"]["isError"]
        assert refused["result"]["content"][0]["text"].startswith("unknown_task: no task '\ufffd'")
        send('{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {')  # cut off mid-way
        broken = answer()
        assert broken["id"] is None and broken["error"]["code"] == -32700
        send('{"jsonrpc": "2.0", "id": 4, "method": 17}')
        invalid = answer()
        assert invalid["id"] == 4 and invalid["error"]["code"] == -32600
        send(json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                         "params": {"name": "get_task", "arguments": {"task_id": "relu"}}}))
        assert answer()["id"] == 5
    finally:
        proc.kill()
        proc.wait()
