"""Sandboxes prepared ahead of time: the same isolation as a fresh one, used once, refilled in the background
when the caller is done."""

import contextlib
import os
import time
from pathlib import Path

import pytest

from kope_mcp.runtime.sandbox import RUN_UID_BASE, SandboxLimits, capabilities, scrubbed_env
from kope_mcp.runtime.sandbox_files import scratch_root
from kope_mcp.runtime.sandbox_warm import PreparedSandbox, SandboxPool

isolated = pytest.mark.skipif(not capabilities().isolated, reason="no isolation on this machine")
LIMITS = SandboxLimits(wall_seconds=20, cpu_seconds=20)


def run(pool: SandboxPool, root: Path, script: str, limits: SandboxLimits = LIMITS):
    with pool.sandbox(root, limits=limits, env=scrubbed_env()) as prepared:
        (prepared.scratch.run / "data.txt").write_text("from the server\n")
        prepared.scratch.hand_over()
        return prepared.execute(["/bin/sh", "-c", script, "sh", "a b", "c'd"])


@isolated
def test_the_command_given_at_release_runs_in_the_run_folder_with_its_arguments_intact(tmp_path):
    pool = SandboxPool()
    result = run(pool, tmp_path, 'pwd; cat data.txt; printf "<%s>" "$@"; echo; echo err >&2; exit 3')
    pool.close()
    assert result.returncode == 3 and not result.timed_out
    assert result.stdout_tail.splitlines() == ["/kope/run", "from the server", "<a b><c'd>"]
    assert result.stderr_tail.strip() == "err"


@isolated
@pytest.mark.skipif(os.geteuid() != 0, reason="a root server gives each run its own uid")
def test_each_use_is_a_new_sandbox_with_its_own_uid_and_nothing_left_by_the_last(tmp_path):
    pool = SandboxPool()
    first = run(pool, tmp_path, "id -u; echo planted > /tmp/mark; echo x > left.txt; ls")
    assert pool.refilled.wait(timeout=30)  # the next one was prepared in the background
    second = run(pool, tmp_path, "id -u; cat /tmp/mark left.txt 2>&1; ls")
    pool.close()
    uid1, uid2 = int(first.stdout_tail.split()[0]), int(second.stdout_tail.split()[0])
    assert uid1 != uid2 and min(uid1, uid2) > RUN_UID_BASE
    assert "planted" not in second.stdout_tail and "No such file" in second.stdout_tail
    assert second.stdout_tail.split()[-1] == "data.txt"
    # Every scratch folder removed, the prepared one included (the server's own lock stays while it lives).
    assert [p.name for p in scratch_root(tmp_path).iterdir()] in ([], [".lock"])


@isolated
def test_a_prepared_sandbox_holds_nothing_of_the_run_s_identity_until_released(tmp_path):
    prepared = PreparedSandbox(tmp_path, LIMITS, scrubbed_env(), ())
    try:
        assert prepared.alive
        if os.geteuid() == 0:
            # Blocked inside bwrap, which runs as root: no process has taken the run's uid (setpriv has not run).
            owners = set()
            for pid in filter(str.isdigit, os.listdir("/proc")):
                with contextlib.suppress(OSError):
                    owners.add(os.stat(f"/proc/{pid}").st_uid)
            assert prepared.scratch.uid not in owners
        prepared.scratch.hand_over()
        result = prepared.execute(["/bin/sh", "-c", "id -u; echo released"])
    finally:
        prepared.close()
    assert result.stdout_tail.split() == [str(prepared.scratch.uid), "released"]


@isolated
def test_the_wall_clock_limit_counts_from_the_release_and_kills_the_run(tmp_path):
    pool = SandboxPool()
    limits = SandboxLimits(wall_seconds=1.0, cpu_seconds=20)
    with pool.sandbox(tmp_path, limits=limits, env=scrubbed_env()) as prepared:
        time.sleep(1.2)  # waiting before the release must not use up the run's time
        prepared.scratch.hand_over()
        ok = prepared.execute(["/bin/sh", "-c", "echo quick"])
    hung = run(pool, tmp_path, "while :; do :; done", limits=limits)
    pool.close()
    assert ok.returncode == 0 and ok.stdout_tail.strip() == "quick"
    assert hung.timed_out and hung.returncode is None


@isolated
def test_a_prepared_sandbox_that_died_is_replaced_by_a_fresh_one(tmp_path):
    pool = SandboxPool()
    run(pool, tmp_path, "true")
    assert pool.refilled.wait(timeout=30)
    (ready,) = pool._ready.values()
    os.killpg(ready.proc.pid, 9)
    ready.proc.wait()
    result = run(pool, tmp_path, "echo still works")
    pool.close()
    assert result.stdout_tail.strip() == "still works"


def test_the_spawner_waits_until_no_sandbox_was_taken_or_returned_for_the_quiet_time():
    pool = SandboxPool(quiet_s=0.2, max_defer_s=10)
    pool._last_activity = time.monotonic()
    started = time.monotonic()
    pool._wait_for_quiet()
    assert time.monotonic() - started >= 0.2 - 1e-3


def test_the_spawner_waits_no_longer_than_the_deferral_cap_under_constant_activity():
    pool = SandboxPool(quiet_s=5, max_defer_s=0.2)
    pool._last_activity = time.monotonic() + 60  # as if a sandbox were taken or returned all the time
    started = time.monotonic()
    pool._wait_for_quiet()
    assert 0.2 - 1e-3 <= time.monotonic() - started < 5
