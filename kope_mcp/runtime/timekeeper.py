"""The trusted clock of profile_kernel: stamps every line the sandboxed harness writes to its timing pipe.

Runs outside the sandbox as its own small process (``python -S -m kope_mcp.runtime.timekeeper CPU ACK_FD``), reading
the pipe on stdin and appending ``<CLOCK_MONOTONIC ns> <line>`` to stdout (a memory file of the server). After
stamping a ``B`` (batch begins) line it writes one byte to ACK_FD, and the harness reads its own clock only once
that byte arrived: so an honest batch's claimed interval always lies inside the stamped one, however late this
process was scheduled. It is a separate process, not a thread of the server, so that the server's threads (and
its GIL) do not delay it. The server pairs the stamps with the claims (:mod:`kope_mcp.targets.timing`).

Only the standard library: it starts in ~20 ms.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

_MAX_LINE = 256
# What the server keeps of the stream (a profile writes a few hundred KiB): a kernel flooding the pipe must not
# fill the server's memory. Past it lines are read and dropped, and the stream ends with a line that breaks the
# protocol, so the measurement is refused.
_MAX_OUTPUT = 32 * 1024**2


def main(argv: list[str]) -> int:
    ack = int(argv[2]) if len(argv) > 2 else None
    if len(argv) > 1 and argv[1].isdigit() and hasattr(os, "sched_setaffinity"):
        # The kernel's own CPU: see Workbench.profile_kernel for why.
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {int(argv[1])})
    pending = b""
    written = 0
    while True:
        chunk = os.read(0, 65536)
        stamp = time.monotonic_ns()  # lines that arrive together share the stamp of their arrival
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        if len(pending) > _MAX_LINE:
            pending = b""  # not the harness's protocol: drop it, the server will find the sequence broken
        if written <= _MAX_OUTPUT:
            data = b"".join(b"%d %s\n" % (stamp, line[:_MAX_LINE]) for line in lines)
            written += len(data)
            os.write(1, data if written <= _MAX_OUTPUT else b"overflow: the stream was cut\n")
        for line in lines:
            if ack is not None and line.startswith(b"B "):
                try:
                    os.write(ack, b"!")
                except BrokenPipeError:
                    ack = None
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
