"""One server process owns a KOPE_HOME's database; every other client reaches it over loopback HTTP.

Kùzu lets one process open the database, so the process that owns a home publishes where it listens:

- ``KOPE_HOME/daemon/owner.lock``: held (flock) by the owning process for its whole life. The kernel drops the
  lock when the process dies, even by ``kill -9``, so a held lock is the liveness test and a stale
  ``state.json`` from a crashed owner is recognised and replaced;
- ``KOPE_HOME/daemon/state.json`` (mode 0600): pid, URL and bearer token of the owner;
- ``KOPE_HOME/daemon/start.lock``: serialises clients that find no owner, so two clients starting at the same
  instant start one daemon, not two.

The owner is either a `kope serve --transport http` you started, or a daemon a stdio client started on demand
(`kope daemon run`: loopback, random port, random token, exits after KOPE_DAEMON_IDLE_S without clients).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from kope_mcp.errors import KopeError

DAEMON_DIR = "daemon"
START_TIMEOUT_S = 90.0


class DaemonError(KopeError):
    code = "daemon_unavailable"


LOG_ROTATE_BYTES = 1024**2


class DaemonState(BaseModel):
    pid: int
    url: str
    token: str | None
    started_at: float
    on_demand: bool
    settings: dict[str, str] = Field(default_factory=dict, description="The owner's KOPE_* settings.")
    holder: str = Field("", description="An admin command holding the home for a while (`kope memory import`); "
                                        "'' for a server.")


def _dir(home: Path, *, create: bool = True) -> Path:
    path = home / DAEMON_DIR
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


class Ownership:
    """The owner's hold on a home: keeps owner.lock locked and removes state.json on release."""

    def __init__(self, home: Path, fd: int) -> None:
        self.home, self._fd = home, fd

    def publish(self, state: DaemonState) -> None:
        path = _dir(self.home) / "state.json"
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(state.model_dump_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def release(self) -> None:
        state = read_state(self.home)
        if state is not None and state.pid == os.getpid():
            (_dir(self.home) / "state.json").unlink(missing_ok=True)
        os.close(self._fd)


def claim(home: Path) -> Ownership | None:
    """Become the home's owner; None when a live process already is."""
    fd = os.open(_dir(home) / "owner.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    # The owner is the only process that may touch the database: what a killed import left beside it (a copy of
    # the whole memory, its log) goes now, not at the next import.
    from kope_mcp.memory.import_modes import remove_staging
    from kope_mcp.settings import MEMORY_FILE

    remove_staging(home / MEMORY_FILE)
    return Ownership(home, fd)


def _owner_alive(home: Path) -> bool:
    lock = _dir(home, create=False) / "owner.lock"
    if not lock.exists():
        return False  # asking about a home nobody ever served creates nothing in it
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's lock if it got one
    return False


def read_state(home: Path) -> DaemonState | None:
    try:
        return DaemonState.model_validate_json((_dir(home, create=False) / "state.json").read_text())
    except (FileNotFoundError, NotADirectoryError, ValueError):  # none published (or no home to publish in)
        return None


def running(home: Path) -> DaemonState | None:
    """The live owner of this home and where it listens, or None (a stale state.json does not count)."""
    state = read_state(home)
    if state is None or not _owner_alive(home):
        return None
    return state


def accepting(url: str) -> bool:
    """Whether the owner at ``url`` accepts connections now (loopback: answered at once when it does)."""
    return _accepts(url, timeout=0.2)


def _accepts(url: str, timeout: float = 1.0) -> bool:
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _start_lock(home: Path) -> Iterator[None]:
    fd = os.open(_dir(home) / "start.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def ensure(home: Path, timeout_s: float = START_TIMEOUT_S) -> DaemonState:
    """The home's live owner, starting a daemon when there is none (at most one, however many clients race)."""
    state = running(home)
    if state is not None and state.holder:
        raise DaemonError(f"{home} is held by `{state.holder}` (pid {state.pid}), which needs the memory to itself "
                          "for a moment: call again when it has finished (nothing was recorded)")
    if state is not None and not state.url:
        raise DaemonError(f"{home} is held by a stdio-only server (pid {state.pid}, `kope serve --no-daemon`): "
                          "stop it, or give this client another KOPE_HOME")
    if state is not None and _accepts(state.url):
        return state
    with _start_lock(home):
        state = running(home)
        if state is None:
            (_dir(home) / "state.json").unlink(missing_ok=True)  # stale: its owner is gone
            state = _spawn(home, timeout_s)
    deadline = time.monotonic() + timeout_s
    while not _accepts(state.url):
        if time.monotonic() > deadline:
            raise DaemonError(f"the kope daemon for {home} (pid {state.pid}) does not accept connections at "
                              f"{state.url}; see {_dir(home) / 'daemon.log'}")
        time.sleep(0.05)
    return state


def _spawn(home: Path, timeout_s: float) -> DaemonState:
    log_path = _dir(home) / "daemon.log"
    if log_path.exists() and log_path.stat().st_size > LOG_ROTATE_BYTES:
        os.replace(log_path, log_path.with_suffix(".log.1"))  # one previous log is kept
    env = {**os.environ, "KOPE_HOME": str(home)}
    with log_path.open("ab") as log:
        child = subprocess.Popen([sys.executable, "-m", "kope_mcp", "daemon", "run"], stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=log, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = running(home)
        if state is not None:
            return state
        if child.poll() is not None:
            state = running(home)  # it may have lost a race to another owner, which is fine
            if state is not None:
                return state
            raise DaemonError(f"the kope daemon for {home} exited with code {child.returncode} before listening: "
                              f"{_tail(log_path, 400)}")
        time.sleep(0.05)
    raise DaemonError(f"the kope daemon for {home} did not start within {timeout_s:.0f} s; see {log_path}")


def stop(home: Path, timeout_s: float = 30.0) -> DaemonState | None:
    """Ask the owner to stop (SIGTERM) and wait until it has let go; one that still holds the home after
    ``timeout_s`` is killed (every acknowledged write is committed). None when nothing was running."""
    state = running(home)
    if state is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(state.pid, signal.SIGTERM)
    if _released(home, timeout_s):
        return state
    with contextlib.suppress(ProcessLookupError):
        os.kill(state.pid, signal.SIGKILL)
    if not _released(home, 10.0):
        raise DaemonError(f"pid {state.pid} still holds {home} {timeout_s + 10:.0f} s after SIGTERM and SIGKILL")
    return state


def _released(home: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _owner_alive(home):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def http_client(state: DaemonState) -> Any:
    """An HTTP client for the owner's MCP endpoint, with its token: 30 s to connect and write, 300 s to read (a
    profile's answer and the event stream take a while). The SDK's own factory for this is private."""
    import httpx2

    headers = {"Authorization": f"Bearer {state.token}"} if state.token else {}
    return httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))


def describe(state: DaemonState) -> str:
    kind = f"`{state.holder}`" if state.holder else "on-demand daemon" if state.on_demand else "server"
    return json.dumps({"kind": kind, "pid": state.pid, "url": state.url, "token": "set" if state.token else None})


def _tail(path: Path, limit: int = 600) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-limit:].strip()
    return ""
