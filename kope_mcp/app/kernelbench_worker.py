"""The sandbox side of `kope tasks import-kernelbench`: plan one problem file (this executes it) and answer JSON.

``python -m kope_mcp.app.kernelbench_worker JOB``, run where kernels run; the server writes nothing of what it is told
until the generated task has been read as an untrusted folder and checked (its reference again in the sandbox).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[1]).read_text())
    from kope_mcp.errors import InvalidTaskError
    from kope_mcp.services.kernelbench_plan import plan_problem
    from kope_mcp.tasks.kernelbench import ProblemError

    try:
        answer = plan_problem(Path(job["problem"]), str(job["task_id"]))
    except (ProblemError, InvalidTaskError) as exc:
        answer = {"skip": str(exc)}
    os.write(int(job["result_fd"]), json.dumps(answer).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
