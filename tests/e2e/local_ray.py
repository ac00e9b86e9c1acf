"""A real local Ray cluster for the cluster tests: a token-authenticated head and a second node, with a `kope
worker`'s devices on each (alpha on the head, beta on the second node)."""

from __future__ import annotations

import importlib.util
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kope_mcp.cluster.config import ray_environment
from kope_mcp.settings import KopeSettings
from kope_mcp.targets.base import Target
from tests.conftest import make_settings

OBJECT_STORE_BYTES = 512 * 1024**2  # per node: a profile's inputs and outputs pass through it
# Ray loads its token once per process: every cluster a test process starts shares this one.
_TOKEN = secrets.token_hex(32)


class LocalCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.token = root / "token"
        self.token.write_text(_TOKEN)
        self.token.chmod(0o600)
        # Ray's memory monitor kills work when the whole machine's memory is above 95% in use, whoever uses it: on
        # a shared machine other jobs filled it and 5 of 9 tests failed. These nodes have a budget of their own
        # (below); the monitor is off for them and for every `kope worker` and head a test starts from here.
        environment = {**ray_environment(self.token), "RAY_memory_monitor_refresh_ms": "0"}
        self.saved = {k: os.environ.get(k) for k in environment}
        os.environ.update(environment)
        import ray
        from ray.cluster_utils import Cluster

        # A memory budget of the cluster's own (not a share of whatever the machine has), and the object store in
        # a folder of its own where /dev/shm is not this user's to write (some containers make it root's 0700).
        self.node_args: dict[str, Any] = {"num_cpus": 1, "object_store_memory": OBJECT_STORE_BYTES}
        if not os.access("/dev/shm", os.W_OK):
            (root / "plasma").mkdir()
            self.node_args["plasma_directory"] = str(root / "plasma")
        self.cluster = Cluster(initialize_head=True, head_node_args={
            **self.node_args, "resources": {"kope-node:alpha": 1}, "include_dashboard": False})
        self.beta = self.add_node("beta")
        ray.init(address=self.cluster.address, namespace="kope", log_to_driver=False)
        self.start("alpha")
        self.start("beta")

    def add_node(self, name: str) -> Any:
        return self.cluster.add_node(**self.node_args, resources={f"kope-node:{name}": 1})

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def start(self, worker: str, classes: dict[str, type[Target]] | None = None) -> list[str]:
        from kope_mcp.cluster.worker import start_devices

        return start_devices(worker, self.root / f"worker-{worker}", list(classes or ["c"]), classes)

    def settings(self, home: Path, **overrides: Any) -> KopeSettings:
        return make_settings(home).model_copy(update={"cluster": self.address, "cluster_token": str(self.token),
                                                      **overrides})

    def close(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# What every test module on a local cluster carries as its pytestmark.
NEEDS_RAY = [pytest.mark.slow,
             pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs kope-mcp[cluster]")]


def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The body of the ``cluster`` fixture (tests/e2e/conftest.py): one cluster per test module. Ray reads its
    authentication settings when it is first imported: this sets them, then imports it."""
    local = LocalCluster(tmp_path_factory.mktemp("ray"))
    try:
        yield local
    finally:
        local.close()
