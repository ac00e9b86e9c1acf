"""The GPU half of profile_kernel's protocol on the CPU: the real coordinator and workers of
targets/gpu_profile_harness.py, with torch's CUDA calls stood in for (tests/fake_cuda.py). The same tricks run on a
device in tests/integrity/test_gpu_probes.py (`pytest -m gpu`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # a subprocess per profile, ~3 s each

HONEST = "import torch\n\ndef kernel(a, b, out, n):\n    torch.add(a, b, out=out)\n"
ROOT = Path(__file__).resolve().parents[3]


def profile(tmp_path: Path, candidate: str, sets: int = 4) -> dict[str, Any]:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"candidate": candidate, "baseline": HONEST, "sets": sets}))
    done = subprocess.run([sys.executable, "-m", "tests.fake_cuda", str(job)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_an_honest_kernel_is_measured_with_every_set_checked(tmp_path):
    result = profile(tmp_path, HONEST)
    assert "fatal" not in result, result
    assert result["checked_sets"] == [0, 1, 2, 3] and result["inconsistent_calls"] == 0
    assert result["inputs_modified"] == [] and result["anchors_poisoned"] == 0
    assert result["gpu_roof"]["fp32_gflops"] == 50.0 and "before" in result["gpu_clocks"]


@pytest.mark.parametrize("candidate", [
    # A helper started once and left running.
    "import threading, time, torch\n_t = []\n\ndef kernel(a, b, out, n):\n    if not _t:\n"
    "        _t.append(threading.Thread(target=time.sleep, args=(60,), daemon=True))\n        _t[0].start()\n"
    "    torch.add(a, b, out=out)\n",
    # Honest while warming up, then a launch left to a thread that outlives the call.
    "import threading, time, torch\n_calls = []\n\ndef kernel(a, b, out, n):\n    _calls.append(1)\n"
    "    if len(_calls) < 6:\n        torch.add(a, b, out=out)\n        return\n"
    "    threading.Thread(target=lambda: (time.sleep(0.05), torch.add(a, b, out=out)), daemon=True).start()\n",
], ids=["helper_left_running", "lazy_launch_after_warm_up"])
def test_a_host_thread_that_outlives_the_call_ends_the_measurement(tmp_path, candidate):
    result = profile(tmp_path, candidate)
    assert result.get("fatal") == "tampered" and "thread" in result["message"], result


def test_outputs_cached_by_pointer_come_back_unwritten(tmp_path):
    result = profile(tmp_path, "import torch\n_seen = set()\n\ndef kernel(a, b, out, n):\n"
                               "    if out.data_ptr() in _seen:\n        return\n"
                               "    _seen.add(out.data_ptr())\n    torch.add(a, b, out=out)\n")
    assert "fatal" not in result and result["anchors_poisoned"] == len(result["checked_sets"])  # judged wrong


def test_a_kernel_exact_only_on_its_first_call_per_set_is_inconsistent(tmp_path):
    result = profile(tmp_path, "import torch\n_seen = set()\n\ndef kernel(a, b, out, n):\n"
                               "    key = a.data_ptr()\n    torch.add(a, b, out=out)\n"
                               "    if key in _seen:\n        out[: n // 2] = 0\n    _seen.add(key)\n", sets=2)
    assert result["inconsistent_calls"] > 0, result


def test_a_kernel_that_writes_its_inputs_is_seen_by_the_coordinator(tmp_path):
    result = profile(tmp_path, "import torch\n\ndef kernel(a, b, out, n):\n    torch.add(a, b, out=out)\n"
                               "    a.mul_(2.0)\n")
    assert result["inputs_modified"] == ["a"], result


def test_a_kernel_that_raises_on_a_timed_call_is_its_crash(tmp_path):
    result = profile(tmp_path, "import torch\n_calls = []\n\ndef kernel(a, b, out, n):\n    _calls.append(1)\n"
                               "    if len(_calls) > 5:\n"
                               "        raise RuntimeError('CUDA error: an illegal memory access')\n"
                               "    torch.add(a, b, out=out)\n")
    assert result.get("fatal") == "crash" and "illegal memory access" in result["message"], result


def run_tests(tmp_path: Path, candidate: str, sizes: list[int]) -> dict[str, Any]:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"mode": "test", "candidate": candidate, "sizes": sizes}))
    done = subprocess.run([sys.executable, "-m", "tests.fake_cuda", str(job)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_run_tests_on_the_device_path_reports_each_case_with_its_guard_zones(tmp_path):
    result = run_tests(tmp_path, HONEST, [1, 7, 4099])
    assert [c["name"] for c in result["cases"]] == ["n1", "n7", "n4099"]
    assert all(c["out_of_bounds"] == [] and c["inputs_modified"] == [] for c in result["cases"])
    # One element past the end, through a view of the allocation the output lives in (an unmasked tail).
    past_the_end = run_tests(tmp_path, "import torch\n\ndef kernel(a, b, out, n):\n    torch.add(a, b, out=out)\n"
                                       "    out.new_empty(0).set_(out.untyped_storage(), out.storage_offset(), "
                                       "(n + 1,))[n] = 1.0\n", [5])
    assert past_the_end["cases"][0]["out_of_bounds"] == ["out after its end"], past_the_end


def test_run_tests_on_the_device_path_fails_a_kernel_that_leaves_a_thread_running(tmp_path):
    lazy = ("import threading, time, torch\n\ndef kernel(a, b, out, n):\n    torch.add(a, b, out=out)\n"
            "    threading.Thread(target=time.sleep, args=(0.5,), daemon=True).start()\n")
    result = run_tests(tmp_path, lazy, [3, 5])
    assert result.get("fatal") == "crash" and result["case"] == "n5" and "host thread" in result["message"], result


def test_a_kernel_that_fails_to_load_is_its_load_error_not_a_dead_worker(tmp_path):
    # The worker replies and then waits to be ended: had it exited at once, the coordinator could find it dead
    # before reading the reply and report a crash instead.
    result = profile(tmp_path, "raise ImportError('no module named cutlass')\n")
    assert result.get("fatal") == "load_error" and "cutlass" in result["message"], result
