"""Red-team fixtures: a server home with secrets in it, and kernels that report whether an attack worked.

An attack kernel computes vector_add correctly and adds 1000 to every output when any of its attempts
succeeded, so ``run_tests(...).passed`` means every attempt failed. The attacks run in a constructor (at
``dlopen``, before ``kernel`` is ever called), in an IFUNC resolver, or in the kernel itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kope_mcp.runtime.sandbox import capabilities
from kope_mcp.services.workbench import Workbench
from kope_mcp.tasks.registry import TaskRegistry
from tests.conftest import make_settings

TOKEN = "kope-secret-token-4f1c9a"

if not capabilities().isolated:
    pytest.skip("no isolation on this machine: every attack here would succeed by design", allow_module_level=True)

PRELUDE = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <dirent.h>
#include <signal.h>
#include <sched.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <arpa/inet.h>
int setns(int fd, int nstype);
#define KOPE_CLONE_NEWNET 0x40000000
static volatile float pwned = 0.0f;
static int readable(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    char c; int n = (int)read(fd, &c, 1); close(fd); return n >= 0;
}
static int writable(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return 0;
    close(fd); return 1;
}
"""


def attack_kernel(*, ctor: str = "", body: str = "", extra: str = "") -> str:
    """vector_add that adds 1000 to every output when an attack in ``ctor`` or ``body`` set ``pwned``."""
    return (PRELUDE + extra +
            f"\n__attribute__((constructor)) static void kope_attack_ctor(void) {{\n{ctor}\n}}\n"
            "void kernel(const float *a, const float *b, float *out, int64_t n) {\n"
            f"{body}\n"
            "    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i] + pwned;\n}\n")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("kope-home")
    (home / "daemon").mkdir()
    (home / "daemon" / "state.json").write_text(json.dumps({"pid": 1, "url": "http://127.0.0.1:1/mcp",
                                                            "token": TOKEN}))
    return home


@pytest.fixture(scope="module")
def workbench(home: Path) -> Iterator[Workbench]:
    bench = Workbench(make_settings(home), TaskRegistry.default())
    yield bench
    bench.store.close()


@pytest.fixture(scope="module")
def user_secret(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in for ~/.ssh/id_rsa: a file of the server's user outside KOPE_HOME."""
    folder = tmp_path_factory.mktemp("home") / ".ssh"
    folder.mkdir()
    key = folder / "id_rsa"
    key.write_text(f"-----BEGIN KEY----- {TOKEN} -----END KEY-----\n")
    key.chmod(0o600)
    return key
