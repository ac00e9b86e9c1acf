#!/usr/bin/env python3
"""The official MCP conformance suite's server scenarios that apply to kope-mcp, against its HTTP app.

    python tools/conformance.py                 # every applicable scenario; exit 1 if any fails
    python tools/conformance.py --all           # every server scenario, the ones for the SDK's test tools too
    python tools/conformance.py --scenario ping

It serves the app `kope serve --transport http` serves (http_server.http_app: the envelope check, the body limit,
resumable streams, the MCP server) on a free loopback port with a fresh home, and runs
`npx @modelcontextprotocol/conformance server` against it, one scenario at a time. The suite sends no bearer token,
so this one server runs without one (loopback, for the length of the run); everything else is as served.

Needs Node.js and npx; the suite comes from the npm registry (the version below runs on Node 20; 0.1.14 and later
need Node 22). "Applicable" leaves out the scenarios that call the reference server's own test tools, prompts and
resources (`test_simple_text`, `test://static-text`, ...), which kope-mcp does not have, and the capabilities it
does not declare (logging, completions, subscriptions, sampling, elicitation).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SUITE = "@modelcontextprotocol/conformance@0.1.12"
APPLICABLE = ["server-initialize", "ping", "tools-list", "resources-list", "prompts-list", "server-sse-polling",
              "server-sse-multiple-streams", "dns-rebinding-protection"]
# Checks of an applicable scenario that judge the reference server's own test tool rather than the protocol: the
# SSE polling scenario calls `test_reconnection` (kope answers unknown_tool) after checking the priming event and
# the retry field, which are what it is for.
EXCUSED = {("server-sse-polling", "incoming-sse-event"): "it calls the reference server's test_reconnection tool"}


def all_scenarios() -> list[str]:
    listed = subprocess.run(["npx", "--yes", SUITE, "list", "--server"], capture_output=True, text=True,
                            timeout=300, check=True).stdout
    return [line.strip()[2:] for line in listed.splitlines() if line.strip().startswith("- ")]


def serve(home: Path) -> tuple[str, object]:
    import uvicorn

    from kope_mcp.app.http_server import Activity, HttpOptions, bind, http_app
    from kope_mcp.settings import KopeSettings

    settings = KopeSettings.from_env(home=home, embeddings=False)
    options = HttpOptions(host="127.0.0.1", port=0, token=None)
    sock = bind(options.host, 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(http_app(settings, options, Activity()), log_level="warning",
                                           lifespan="on"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 120
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("the HTTP app did not start within 120 s")
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}/mcp", server


def run(url: str, scenario: str, out: Path) -> tuple[bool, str]:
    done = subprocess.run(["npx", "--yes", SUITE, "server", "--url", url, "--scenario", scenario,
                           "--output-dir", str(out / scenario)], capture_output=True, text=True, timeout=300)
    checks = []
    for found in sorted((out / scenario).rglob("checks.json")):
        checks += json.loads(found.read_text())
    failed = [c for c in checks if c.get("status") == "FAILURE" and (scenario, c.get("id")) not in EXCUSED]
    excused = sorted({EXCUSED[(scenario, c.get("id"))] for c in checks
                      if c.get("status") == "FAILURE" and (scenario, c.get("id")) in EXCUSED})
    if not checks:
        return done.returncode == 0, (done.stdout + done.stderr).strip().splitlines()[-1:][0] if (
            done.stdout + done.stderr).strip() else "no output"
    passed = len([c for c in checks if c.get("status") != "FAILURE"])
    summary = f"{passed}/{len(checks)} checks" + (f", the rest excused: {'; '.join(excused)}" if excused else "")
    if failed:
        summary += ": " + "; ".join(f"{c.get('id')}: {c.get('errorMessage', '')}"[:200] for c in failed[:3])
    return not failed, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="every server scenario, not only the applicable ones")
    parser.add_argument("--scenario", action="append", help="only this scenario (repeatable)")
    args = parser.parse_args()
    if shutil.which("npx") is None:
        print("conformance: needs Node.js and npx (the suite is an npm package)", file=sys.stderr)
        return 2
    os.environ.setdefault("KOPE_EMBEDDINGS", "off")
    scenarios = args.scenario or (all_scenarios() if args.all else APPLICABLE)
    with tempfile.TemporaryDirectory(prefix="kope-conformance-") as tmp:
        url, server = serve(Path(tmp) / "home")
        failures = 0
        print(f"{SUITE} against {url}")
        for scenario in scenarios:
            ok, summary = run(url, scenario, Path(tmp) / "results")
            failures += not ok
            print(f"  {'PASS' if ok else 'FAIL'}  {scenario:34} {summary}")
        server.should_exit = True  # type: ignore[attr-defined]
    print(f"{len(scenarios) - failures}/{len(scenarios)} scenarios passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
