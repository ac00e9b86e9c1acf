"""Sandboxes set up before they are needed, so a compile does not wait for namespaces and mounts.

Building a sandbox (``prlimit`` + ``bwrap``: namespaces, a tmpfs root, ~20 read-only binds, /dev, /proc) costs
6-10 ms here, a fifth of a small compile. A :class:`SandboxPool` keeps one sandbox per configuration ready:
``bwrap --block-fd`` finishes every mount, drops its privileges and then waits, before anything of the run
executes. A call takes the ready sandbox, writes its files into the run's folder, writes the command line
(quoted, into the read-only inputs folder), and releases it; the run's uid's shell reads the command and
``exec``s it. A background thread prepares the next one.

Each prepared sandbox is used once, with its own scratch folder and its own uid, exactly as
:func:`kope_mcp.runtime.sandbox.run_sandboxed` would have made it: nothing of a run is shared with the next, and nothing
untrusted runs before the release. The spawner thread lives as long as the server, because ``--die-with-parent``
ties a sandbox to the thread that started it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from kope_mcp.runtime import sandbox_seccomp
from kope_mcp.runtime.sandbox import (
    SANDBOX_INPUTS,
    SANDBOX_RUN,
    SandboxLimits,
    SandboxResult,
    Scratch,
    bwrap_argv,
    capabilities,
    finish,
    identity_prefix,
    memory_file,
    options_by_fd,
    prlimit_prefix,
)

log = logging.getLogger(__name__)

JOB_NAME = ".job"
# The run's shell: into the run's folder (bwrap cannot enter it: it belongs to the run's uid), then the command.
_LAUNCHER = ["/bin/sh", "-c", f'cd {SANDBOX_RUN} && . {SANDBOX_INPUTS}/{JOB_NAME}']
Key = tuple[Path, SandboxLimits, tuple[tuple[str, str], ...], tuple[Path, ...]]


class PreparedSandbox:
    """One sandbox, set up and blocked until :meth:`execute`; usable once."""

    def __init__(self, scratch_root: Path, limits: SandboxLimits, env: dict[str, str],
                 binds: Sequence[Path]) -> None:
        caps = capabilities()
        assert caps.isolated and caps.bwrap is not None
        self.limits = limits
        self.scratch = Scratch(scratch_root)
        self.used = False
        for path in binds:
            self.scratch.place(path)
        self.scratch.hand_over()
        release_r, self._release_w = os.pipe()
        self._out, self._err = memory_file("stdout"), memory_file("stderr")
        filter_fd = sandbox_seccomp.program_fd() if caps.seccomp else None
        argv = bwrap_argv(caps.bwrap, caps.mode, self.scratch.uid, binds=self.scratch.binds,
                          run_dir=self.scratch.run, disable_userns=caps.disable_userns, seccomp_fd=filter_fd)
        bwrap, args_fd = options_by_fd([*argv[:-1], "--block-fd", str(release_r), "--"])
        cmd = [*bwrap, *identity_prefix(caps.mode, self.scratch.uid), *_LAUNCHER]
        if caps.rlimits:
            cmd = [*prlimit_prefix(limits), *cmd]
        try:
            self.proc = subprocess.Popen(
                cmd, cwd=self.scratch.run, env=env, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err,
                start_new_session=True,
                pass_fds=(release_r, args_fd) if filter_fd is None else (release_r, args_fd, filter_fd), umask=0o022)
        except OSError:
            self.close()
            raise
        finally:
            os.close(release_r)
            os.close(args_fd)
            if filter_fd is not None:
                os.close(filter_fd)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def execute(self, argv: list[str]) -> SandboxResult:
        """Run ``argv`` in the run's folder (write its files there first, then :meth:`Scratch.hand_over`)."""
        assert not self.used, "a prepared sandbox runs one command"
        self.used = True
        job = self.scratch.inputs / JOB_NAME
        job.write_text(f"exec {shlex.join(argv)}\n", encoding="utf-8")
        job.chmod(0o644)
        start = time.monotonic()
        with contextlib.suppress(BrokenPipeError):  # it died while waiting: finish() says how it ended
            os.write(self._release_w, b"x")
        os.close(self._release_w)
        self._release_w = -1
        return finish(self.proc, self.limits, start, self._out, self._err, self.scratch.uid)

    def close(self) -> None:
        """Kill what is left of it and remove its scratch folder."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)
            proc.wait()
        for fd in (self._release_w, self._out, self._err):
            if fd >= 0:
                os.close(fd)
        self._release_w = self._out = self._err = -1
        self.scratch.remove()


# The spawner's work (preparing the next sandbox: ~10 ms of fork, exec and mounts; removing a used one's folder)
# waits until no sandbox has been taken or returned for QUIET_S, at most MAX_DEFER_S: done at once, it ran
# during the caller's build and its answer (the read-back, the memory write), taking CPU and the GIL from them.
# An agent thinks for seconds between compiles; a compile that comes sooner builds its own sandbox.
QUIET_S = 0.05
MAX_DEFER_S = 1.0


class SandboxPool:
    """One prepared sandbox per configuration, refilled in the background after each use."""

    def __init__(self, quiet_s: float = QUIET_S, max_defer_s: float = MAX_DEFER_S) -> None:
        self.quiet_s, self.max_defer_s = quiet_s, max_defer_s
        self._last_activity = time.monotonic()
        self._ready: dict[Key, PreparedSandbox] = {}
        self._lock = threading.Lock()
        self._wanted: queue.SimpleQueue[Key | PreparedSandbox | None] = queue.SimpleQueue()  # to prepare, to remove
        self._thread: threading.Thread | None = None
        self.refilled = threading.Event()  # set after each background refill (tests wait on it)

    @contextlib.contextmanager
    def sandbox(self, scratch_root: Path, *, limits: SandboxLimits, env: dict[str, str],
                binds: Sequence[Path] = ()) -> Iterator[PreparedSandbox]:
        """A ready sandbox for this configuration (the prepared one, else a new one), removed afterwards. Only
        where kernels can be isolated (``capabilities().isolated``); elsewhere use ``run_sandboxed``."""
        key: Key = (scratch_root, limits, tuple(sorted(env.items())), tuple(binds))
        self._last_activity = time.monotonic()
        with self._lock:
            ready = self._ready.pop(key, None)
        if ready is not None and not ready.alive:
            ready.close()
            ready = None
        prepared = ready or PreparedSandbox(scratch_root, limits, env, binds)
        self._refill(key)
        try:
            yield prepared
        finally:
            self._last_activity = time.monotonic()
            if prepared.used:
                # finish() already killed and reaped everything the run started: removing its folder can wait
                # for the spawner thread, off the caller's path.
                self._wanted.put(prepared)
            else:
                prepared.close()

    def _refill(self, key: Key) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._spawner, name="kope-sandbox-spawner", daemon=True)
                self._thread.start()
        self._wanted.put(key)

    def _spawner(self) -> None:
        while True:
            key = self._wanted.get()
            if key is None:
                return
            self._wait_for_quiet()
            if isinstance(key, PreparedSandbox):
                key.close()
                continue
            with self._lock:
                if key in self._ready:
                    continue
            scratch_root, limits, env, binds = key
            try:
                prepared = PreparedSandbox(scratch_root, limits, dict(env), binds)
            except OSError as exc:  # a full disk, no more processes: the next call builds its own
                log.warning("could not prepare a sandbox ahead of time: %s", exc)
                continue
            with self._lock:
                stale = self._ready.pop(key, None)
                self._ready[key] = prepared
            if stale is not None:
                stale.close()
            self.refilled.set()

    def _wait_for_quiet(self) -> None:
        deadline = time.monotonic() + self.max_defer_s
        while (now := time.monotonic()) < deadline:
            quiet_for = now - self._last_activity
            if quiet_for >= self.quiet_s:
                return
            time.sleep(min(self.quiet_s - quiet_for, deadline - now))

    def close(self) -> None:
        """Stop preparing and remove every prepared sandbox (at exit; a server that dies leaves scratch folders
        its successor removes)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._wanted.put(None)
            thread.join(timeout=30)
        while True:  # used sandboxes still waiting for removal (the spawner stopped first)
            try:
                item = self._wanted.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, PreparedSandbox):
                item.close()
        with self._lock:
            ready, self._ready = list(self._ready.values()), {}
        for prepared in ready:
            prepared.close()


POOL = SandboxPool()
atexit.register(POOL.close)
