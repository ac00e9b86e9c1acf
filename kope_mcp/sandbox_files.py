"""What a sandboxed run leaves behind, read and removed safely: scratch folders, files, memory files.

The parent never reads back by path what the sandbox wrote: stdout and stderr go to memory files the parent created,
results come through descriptors it passes in, and the one file a build leaves behind is opened with ``O_NOFOLLOW``
relative to a directory descriptor and checked (regular file, expected owner, size cap) by :func:`read_back`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

_TAIL_BYTES = 16 * 1024


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


def remove_stale_scratch(root: Path) -> int:
    """Remove scratch folders whose server process is gone; how many were removed."""
    if not root.is_dir():
        return 0
    removed = 0
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
