"""What a sandboxed run leaves behind, read and removed safely: scratch folders, files, memory files.

The parent never reads back by path what the sandbox wrote: stdout and stderr go to memory files the parent created,
results come through descriptors it passes in, and the one file a build leaves behind is opened with ``O_NOFOLLOW``
relative to a directory descriptor and checked (regular file, expected owner, size cap) by :func:`read_back`.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import tempfile
import threading
from pathlib import Path

_TAIL_BYTES = 16 * 1024
# Scratch lives on a tmpfs when one has room: a bind mount shows its source's path within its filesystem in the
# run's /proc/self/mountinfo, and from a tmpfs that path is only "/kope-<random>/<random>/run" (from the home it
# was "<KOPE_HOME>/scratch/<server pid>-…/run").
NEUTRAL_PREFIX = "kope-"
_NEUTRAL_MIN_FREE = 1024**3
_LOCK = ".lock"
_neutral: dict[Path, Path] = {}
_neutral_guard = threading.Lock()
_held_locks: list[int] = []


def remove_tree(path: Path) -> None:
    def unlock(func: object, target: str, _exc: object) -> None:
        # The sandbox may leave 0000 folders behind; the owner can always chmod them back.
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700, follow_symlinks=False)
        with contextlib.suppress(OSError):
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target, ignore_errors=True)
            else:
                os.unlink(target)

    shutil.rmtree(path, onerror=unlock)


def neutral_candidates() -> list[Path]:
    return [Path("/dev/shm"), Path(tempfile.gettempdir())]


def scratch_root(home_scratch: Path) -> Path:
    """Where this server's runs get their folders: a ``kope-<random>`` folder (0700, ours) on the first tmpfs-like
    place with a gigabyte free, locked for the server's lifetime so that a later server removes it once this one is
    gone; else ``home_scratch`` (folders there are named after the server's pid)."""
    with _neutral_guard:
        if home_scratch in _neutral:
            return _neutral[home_scratch]
        chosen = home_scratch
        for candidate in neutral_candidates():
            made = _make_neutral(candidate)
            if made is not None:
                chosen = made
                break
        _neutral[home_scratch] = chosen
        return chosen


def _make_neutral(parent: Path) -> Path | None:
    try:
        info = os.statvfs(parent)
        if info.f_bavail * info.f_frsize < _NEUTRAL_MIN_FREE:
            return None
        mode = os.stat(parent).st_mode
        if not stat.S_ISDIR(mode) or (mode & 0o002 and not mode & stat.S_ISVTX):
            return None  # world-writable without the sticky bit: anyone could rename our folder away
        path = parent / f"{NEUTRAL_PREFIX}{secrets.token_hex(8)}"
        path.mkdir(mode=0o700)
        lock = os.open(path / _LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return None
    _held_locks.append(lock)  # held until the process ends: that is what tells a later server we are alive
    atexit.register(_remove_own, path, os.getpid())
    return path


def _remove_own(path: Path, creator: int) -> None:
    if os.getpid() == creator:  # not in a forked child that happens to run exit handlers
        remove_tree(path)


def _remove_stale_neutral() -> int:
    removed = 0
    for parent in neutral_candidates():
        try:
            entries = [e for e in os.scandir(parent) if e.name.startswith(NEUTRAL_PREFIX)]
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
                ours = Path(entry.path) in _neutral.values()
                if ours or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                    continue
                lock = os.open(os.path.join(entry.path, _LOCK), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its server is alive
            finally:
                os.close(lock)
            remove_tree(Path(entry.path))
            removed += 1
    return removed


def remove_stale_scratch(root: Path) -> int:
    """Remove scratch folders whose server process is gone (in ``root``, and this user's ``kope-*`` folders on
    the neutral places); how many were removed."""
    removed = _remove_stale_neutral()
    if not root.is_dir():
        return removed
    for entry in root.iterdir():
        pid = entry.name.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            remove_tree(entry)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- reading what the sandbox left -----------------------------------------------------------------------------
class UntrustedFileError(Exception):
    """A file the sandbox left is not what it should be (missing, a link, not regular, too big, wrong owner)."""


def read_back(dir_fd: int, name: str, *, owner: int, max_bytes: int) -> bytes:
    """Read ``name`` from a directory the sandbox could write, never following a link the sandbox planted."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError as exc:
        raise UntrustedFileError(f"{name} was not produced") from exc
    except OSError as exc:
        raise UntrustedFileError(f"{name} cannot be opened safely ({exc.strerror}): a symbolic link?") from exc
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFileError(f"{name} is not a regular file")
        if info.st_uid != owner:
            raise UntrustedFileError(f"{name} is owned by uid {info.st_uid}, not by the run (uid {owner})")
        if info.st_size > max_bytes:
            raise UntrustedFileError(f"{name} is {info.st_size} bytes, over the {max_bytes}-byte cap")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UntrustedFileError(f"{name} grew over the {max_bytes}-byte cap")
    return data


def memory_file(name: str) -> int:
    """An anonymous file only this process and the descriptors it hands out can reach."""
    return os.memfd_create(f"kope-{name}", os.MFD_CLOEXEC)


def read_memory_file(fd: int, max_bytes: int) -> bytes:
    size = os.fstat(fd).st_size
    os.lseek(fd, max(0, size - max_bytes) if max_bytes < size else 0, os.SEEK_SET)
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _tail_of(fd: int) -> str:
    size = os.fstat(fd).st_size
    text = read_memory_file(fd, _TAIL_BYTES).decode("utf-8", errors="replace")
    return ("[... earlier output cut ...]\n" + text) if size > _TAIL_BYTES else text
