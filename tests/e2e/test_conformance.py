"""The official MCP conformance suite's applicable server scenarios pass against the HTTP app (tools/conformance.py).
Skipped where Node.js is missing or the suite cannot be fetched from the npm registry."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # npx, a server in a subprocess

ROOT = Path(__file__).resolve().parents[2]


def test_the_applicable_conformance_scenarios_all_pass():
    import runpy

    SUITE = runpy.run_path(str(ROOT / "tools" / "conformance.py"), run_name="conformance")["SUITE"]
    if shutil.which("npx") is None:
        pytest.skip("no npx: the conformance suite is an npm package")
    fetched = subprocess.run(["npx", "--yes", SUITE, "--version"], capture_output=True, text=True, timeout=300)
    if fetched.returncode != 0:
        pytest.skip(f"the conformance suite could not be fetched: {fetched.stderr.strip()[-200:]}")
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "conformance.py")], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "8/8 scenarios passed" in done.stdout, done.stdout
