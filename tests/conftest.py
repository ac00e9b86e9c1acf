from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Hashable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kope_mcp.services.workbench import Workbench
from kope_mcp.settings import KopeSettings
from kope_mcp.tasks.registry import SUITE_DIR, TaskRegistry

# A daemon started by a test (stdio clients share the home through one) must not outlive the run for long.
os.environ.setdefault("KOPE_DAEMON_IDLE_S", "20")


def vector_add_with_baseline(root: Path, task_id: str, baseline_c: str) -> TaskRegistry:
    """A registry holding only the suite's vector_add, renamed ``task_id``, with ``baseline_c`` as its C baseline
    (its GPU baselines removed): a task whose baseline a test controls."""
    folder = root / "tasks" / task_id
    shutil.copytree(SUITE_DIR / "vector_add", folder)
    for extra in ("baseline.cu", "baseline_triton.py"):
        (folder / extra).unlink()
    (folder / "baseline.c").write_text(baseline_c)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace('id = "vector_add"', f'id = "{task_id}"', 1))
    return TaskRegistry([folder.parent])


def make_settings(home: Path, embeddings: bool = False) -> KopeSettings:
    # Short caps keep the suite fast; measurement quality is checked by tools/bench_profile.py, not here.
    # Embeddings are off unless a test is about semantic search (loading the model takes seconds).
    return KopeSettings.from_env(home=home, test_timeout_s=8.0, profile_time_cap_s=0.3, embeddings=embeddings)


@pytest.fixture(scope="session")
def registry() -> TaskRegistry:
    return TaskRegistry.default()


@pytest.fixture(scope="module")
def workbench(tmp_path_factory: pytest.TempPathFactory, registry: TaskRegistry) -> Iterator[Workbench]:
    yield Workbench(make_settings(tmp_path_factory.mktemp("kope-home")), registry)


def everyday_sample(params: Iterable[Any], group: Callable[[Any], Hashable]) -> list[Any]:
    """A sweep's parameters with the first of each group (e.g. one task per family) in the everyday tier
    (`-m "not slow"`) and the rest marked slow: every kind is still covered every day, all of it in the full run."""
    seen: set[Hashable] = set()
    out = []
    for param in params:
        key = group(param)
        out.append(pytest.param(*(param if isinstance(param, tuple) else (param,)),
                                marks=() if key not in seen else pytest.mark.slow))
        seen.add(key)
    return out


VECTOR_ADD_OK = """
#include <stdint.h>
void kernel(const float *a, const float *b, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
"""


def vector_add_with_body(body: str, prelude: str = "") -> str:
    """A vector_add kernel whose body is replaced, for failure-mode tests."""
    return (
        "#include <stdint.h>\n#include <stdlib.h>\n#include <unistd.h>\n#include <stdio.h>\n#include <math.h>\n"
        f"{prelude}\nvoid kernel(const float *a, const float *b, float *out, int64_t n) {{\n{body}\n}}\n"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` need an NVIDIA GPU: skipped without one (CI never has one; `pytest -m gpu` on a GPU
    machine runs them)."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    from kope_mcp.targets.gpu import detect_gpu

    if detect_gpu() is None:
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none here)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)
