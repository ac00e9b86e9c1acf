"""Fixtures of the end-to-end tests that need more than one module's setup."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.local_ray import LocalCluster, local_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real local Ray cluster (token-authenticated, two nodes, a `kope worker`'s devices on each)."""
    yield from local_cluster(tmp_path_factory)
