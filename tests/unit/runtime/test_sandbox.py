"""The sandbox layer on its own: identity, capabilities, mounts, limits and the safe read-back."""

import fcntl
import os
import socket
import stat
import time
from pathlib import Path

import pytest

from kope_mcp.runtime import sandbox_files
from kope_mcp.runtime.sandbox import (
    RUN_UID_BASE,
    SandboxLimits,
    Scratch,
    UntrustedFileError,
    capabilities,
    read_back,
    remove_stale_scratch,
    run_sandboxed,
    scrubbed_env,
)

needs_sandbox = pytest.mark.skipif(not capabilities().isolated, reason="no isolation on this machine")
LIMITS = SandboxLimits(wall_seconds=20, cpu_seconds=20)


def sh(scratch: Scratch, script: str, **kwargs):
    return run_sandboxed(["/bin/sh", "-c", script], scratch=scratch, limits=kwargs.pop("limits", LIMITS),
                         env=scrubbed_env(), **kwargs)


@pytest.fixture
def scratch(tmp_path: Path):
    with Scratch(tmp_path / "scratch") as s:
        yield s


@needs_sandbox
def test_a_run_has_no_capabilities_and_no_new_privileges(scratch):
    run = sh(scratch, "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status")
    fields = dict(line.split(":\t") for line in run.stdout_tail.splitlines())
    assert fields["NoNewPrivs"] == "1"
    assert all(int(fields[k], 16) == 0 for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")), fields


@needs_sandbox
@pytest.mark.skipif(os.geteuid() != 0, reason="a root server gives each run its own uid")
def test_every_run_of_a_root_server_has_its_own_uid(tmp_path):
    uids = set()
    for _ in range(3):
        with Scratch(tmp_path / "scratch") as s:
            uids.add(int(sh(s, "id -u").stdout_tail))
    assert len(uids) == 3 and all(uid > RUN_UID_BASE for uid in uids)


@needs_sandbox
def test_only_the_run_directory_is_writable_and_the_host_is_invisible(scratch, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    script = (f"cat {secret}; ls /home /root/.ssh; touch /usr/x /etc/x; "
              f"echo ok > mine && cat /kope/run/mine; ls {scratch.path} {tmp_path}; ls /proc | grep -c '^[0-9]'")
    run = sh(scratch, script)
    assert "s3cret" not in run.stdout_tail
    assert "No such file" in run.stderr_tail and "Read-only file system" in run.stderr_tail
    assert "ok" in run.stdout_tail and (scratch.run / "mine").read_text() == "ok\n"
    # Not even where the server keeps its scratch space is visible.
    assert run.stderr_tail.count("No such file") >= 4
    # A fresh /proc: the shell, its command and the sandbox's init, not the host's processes.
    assert int(run.stdout_tail.split()[-1]) <= 4


@needs_sandbox
def test_there_is_no_network_not_even_loopback(scratch):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    script = ("python3 -c \"import socket,sys; s=socket.socket(); "
              f"sys.exit(0 if s.connect_ex(('127.0.0.1', {port})) else 7)\"")
    try:
        run = sh(scratch, script)
    finally:
        listener.close()
    assert run.returncode == 0, run.stderr_tail


@needs_sandbox
def test_rlimits_cannot_be_raised(scratch):
    run = sh(scratch, "ulimit -H -v unlimited && echo raised; ulimit -H -v")
    assert "raised" not in run.stdout_tail
    assert str(LIMITS.address_space_bytes // 1024) in run.stdout_tail


@needs_sandbox
def test_nothing_started_in_a_run_outlives_it(scratch, tmp_path):
    marker = f"kope-survivor-{os.getpid()}"
    sh(scratch, f"(setsid sh -c 'exec -a {marker} sleep 30' &) ; sleep 0.2")
    survivors = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).startswith(marker)]
    assert survivors == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_read_back_refuses_links_fifos_strangers_and_oversize_files(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (tmp_path / "token").write_text("secret-token")
    (folder / "link").symlink_to(tmp_path / "token")
    os.mkfifo(folder / "fifo")
    (folder / "big").write_bytes(b"x" * 100)
    (folder / "good").write_bytes(b"library")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        me = os.geteuid()
        assert read_back(fd, "good", owner=me, max_bytes=100) == b"library"
        for name, owner, cap, reason in [("link", me, 100, "link"), ("fifo", me, 100, "not a regular"),
                                         ("big", me, 10, "cap"), ("good", me + 1, 100, "owned by"),
                                         ("absent", me, 100, "not produced")]:
            with pytest.raises(UntrustedFileError, match=reason):
                read_back(fd, name, owner=owner, max_bytes=cap)
    finally:
        os.close(fd)


@needs_sandbox
def test_a_stopping_server_ends_a_run_in_flight_at_once_and_any_run_started_after(scratch, tmp_path):
    import threading
    import time

    from kope_mcp.runtime import sandbox

    result = {}
    runner = threading.Thread(target=lambda: result.update(run=sh(scratch, "sleep 30; echo finished")))
    runner.start()
    time.sleep(1.0)
    start = time.monotonic()
    try:
        assert sandbox.end_all_runs() == 1 and sandbox.stopping()
        runner.join(timeout=10)
        assert not runner.is_alive() and time.monotonic() - start < 5
        assert "finished" not in result["run"].stdout_tail and result["run"].returncode != 0
        with Scratch(tmp_path / "later") as later:
            assert "finished" not in sh(later, "sleep 30; echo finished").stdout_tail
    finally:
        sandbox._stopping.clear()  # process-wide: the tests after this one run sandboxes again


def test_scratch_folders_of_dead_servers_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox_files, "neutral_candidates", lambda: [])
    root = tmp_path / "scratch"
    root.mkdir()
    dead = root / "999999999-abc"
    (dead / "run" / "locked").mkdir(parents=True)
    (dead / "run" / "locked").chmod(0)
    live = root / f"{os.getppid()}-def"
    live.mkdir()
    assert remove_stale_scratch(root) == 1
    assert not dead.exists() and live.exists()


def test_a_tmpfs_scratch_folder_whose_server_is_gone_is_removed_and_a_live_one_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox_files, "neutral_candidates", lambda: [tmp_path])
    dead, live = tmp_path / "kope-dead", tmp_path / "kope-live"
    for folder in (dead, live):
        (folder / "run" / "locked").mkdir(parents=True)
        (folder / ".lock").touch()
    (dead / "run" / "locked").chmod(0)
    held = os.open(live / ".lock", os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # another description: to this process's check, a live server's lock
        assert remove_stale_scratch(tmp_path / "home-scratch") == 1
    finally:
        os.close(held)
    assert not dead.exists() and live.exists()


@needs_sandbox
def test_the_mount_table_of_a_run_names_neither_the_home_nor_the_server(tmp_path):
    home_scratch = tmp_path / "home" / "scratch"
    with Scratch(home_scratch) as s:
        table = sh(s, "cat /proc/self/mountinfo").stdout_tail
    assert "/kope/run" in table
    for leak in (str(tmp_path), "scratch", f"{os.getpid()}-"):
        assert leak not in table


def test_a_scratch_folder_is_private_to_the_server(tmp_path):
    with Scratch(tmp_path / "scratch") as s:
        assert stat.S_IMODE(s.path.stat().st_mode) == 0o700
        assert stat.S_IMODE(s.run.stat().st_mode) == 0o700


@needs_sandbox
def test_a_kernels_run_has_size_capped_memory_folders_and_a_compile_keeps_its_host_folder(scratch):
    if not capabilities().sized_tmpfs:
        pytest.skip("this bubblewrap cannot size a tmpfs")
    cap = 8 * 1024**2
    fill = "for f in /tmp/a /tmp/b ./c ./d; do head -c 6291456 /dev/zero > $f || echo full $f; done; ls"
    run = sh(scratch, fill, limits=SandboxLimits(wall_seconds=20, cpu_seconds=20, scratch_bytes=cap),
             private_run=True)
    # 6 MiB fit in 8, twice 6 do not: in /tmp and in the run's own folder, each capped as a whole.
    assert "full /tmp/b" in run.stdout_tail and "full ./d" in run.stdout_tail, run.stdout_tail
    assert "full /tmp/a" not in run.stdout_tail and "full ./c" not in run.stdout_tail
    assert not any(scratch.run.iterdir())  # the host's run folder was never the kernel's
    compiled = sh(scratch, "echo product > ./out.o")
    assert compiled.returncode == 0 and (scratch.run / "out.o").exists()


@needs_sandbox
def test_a_reaching_run_is_its_namespaces_pid_1(scratch):
    assert sh(scratch, "echo $$", reaching=True).stdout_tail.strip() == "1"
    assert sh(scratch, "echo $$").stdout_tail.strip() != "1"  # others run under bubblewrap's reaper


@needs_sandbox
@pytest.mark.parametrize("reaching", [False, True])
def test_a_run_ended_at_its_wall_clock_leaves_no_process_whoever_is_its_pid_1(scratch, reaching):
    marker = 86_400 + int(reaching) + os.getpid() % 1000 * 10  # a sleep length no other process here uses
    run = sh(scratch, f"sleep {marker} & sleep {marker}", limits=SandboxLimits(wall_seconds=1.5, cpu_seconds=20),
             reaching=reaching)
    assert run.timed_out
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _sleepers(marker):
        time.sleep(0.1)
    assert not _sleepers(marker)


def _sleepers(marker: int) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if fh.read().split(b"\0")[:2] == [b"sleep", str(marker).encode()]:
                    found.append(entry)
        except OSError:
            continue
    return found
