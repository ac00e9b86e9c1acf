"""A GPU run's sandbox reaches the assigned GPU's nodes and the driver's libraries, and a CPU run none of them:
the argument construction and the discovery, on any machine (the device itself: `pytest -m gpu`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kope_mcp.runtime.sandbox_gpu import (
    GpuBinding,
    GpuNodesUnavailable,
    driver_library_dirs,
    gpu_binding,
    loaded_driver_dirs,
)
from kope_mcp.runtime.sandbox_setup import SandboxLimits, bwrap_argv, prlimit_prefix


def fake_dev(tmp_path: Path, names: tuple[str, ...] = ("nvidia0", "nvidiactl", "nvidia-uvm")) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in names:
        (dev / name).symlink_to("/dev/null")  # a character device, mode 0666, like NVIDIA's default nodes
    return dev


def test_a_gpu_run_binds_exactly_the_assigned_gpu_and_the_control_nodes(tmp_path):
    dev = fake_dev(tmp_path, ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"))
    binding = gpu_binding(1, per_run_uid=True, dev=dev, listing="", maps="")
    assert binding.nodes == (str(dev / "nvidia1"), str(dev / "nvidiactl"), str(dev / "nvidia-uvm"))
    assert binding.env() == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    argv = bwrap_argv("bwrap", "per-run-uid", 1_900_000_001, binds={}, run_dir=None, disable_userns=False,
                      dev_nodes=binding.nodes)
    pairs = [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == "--dev-bind"]
    assert pairs == [(n, n) for n in binding.nodes]
    assert argv.index("--dev-bind") > argv.index("--dev")  # over bubblewrap's minimal /dev, not instead of it


def test_a_cpu_run_sees_no_gpu_node():
    argv = bwrap_argv("bwrap", "user-namespace", os.getuid(), binds={}, run_dir=None, disable_userns=True)
    assert "--dev-bind" not in argv and not any("nvidia" in a for a in argv)


@pytest.mark.parametrize(("missing", "why"), [("nvidia0", "missing"), ("nvidia-uvm", "nvidia-modprobe")])
def test_a_missing_node_says_which_and_why(tmp_path, missing, why):
    dev = fake_dev(tmp_path, tuple(n for n in ("nvidia0", "nvidiactl", "nvidia-uvm") if n != missing))
    with pytest.raises(GpuNodesUnavailable, match=why):
        gpu_binding(0, per_run_uid=False, dev=dev, listing="", maps="")


def test_a_node_that_is_not_a_device_is_refused(tmp_path):
    dev = fake_dev(tmp_path, ("nvidia0", "nvidia-uvm"))
    (tmp_path / "plain").write_text("")
    (dev / "nvidiactl").symlink_to(tmp_path / "plain")
    with pytest.raises(GpuNodesUnavailable, match="not a character device"):
        gpu_binding(0, per_run_uid=True, dev=dev, listing="", maps="")


def test_a_node_a_per_run_uid_cannot_open_is_refused_with_the_fix(tmp_path):
    dev = fake_dev(tmp_path, ("nvidiactl", "nvidia-uvm"))
    try:
        os.mknod(dev / "nvidia0", 0o660 | stat.S_IFCHR, os.makedev(195, 0))
    except PermissionError:
        pytest.skip("making a device node needs root")
    with pytest.raises(GpuNodesUnavailable, match=r"is mode 06.0.*NVreg_DeviceFileMode"):
        gpu_binding(0, per_run_uid=True, dev=dev, listing="", maps="")
    assert gpu_binding(0, per_run_uid=False, dev=dev, listing="", maps="").nodes[0] == str(dev / "nvidia0")


def test_driver_libraries_outside_the_system_folders_are_bound_and_put_on_the_loaders_path(tmp_path):
    driver = tmp_path / "driver" / "lib64"
    driver.mkdir(parents=True)
    listing = (f"\tlibcuda.so.1 (libc6,x86-64) => {driver}/libcuda.so.1\n"
               "\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n"
               f"\tlibm.so.6 (libc6,x86-64) => {tmp_path}/libm.so.6\n")
    assert driver_library_dirs(listing) == (driver,)
    elsewhere = tmp_path / "nvidia" / "lib64"
    elsewhere.mkdir(parents=True)
    maps = f"7f00-7f10 r-xp 00000000 08:01 1234      {elsewhere}/libcuda.so.580.159.04\n7f10-7f20 rw-p 0 0:0 0\n"
    assert loaded_driver_dirs(maps) == (elsewhere,)
    binding = gpu_binding(0, per_run_uid=False, dev=fake_dev(tmp_path), listing=listing, maps=maps)
    assert binding.libraries == (driver, elsewhere)
    # Found only through the server's LD_LIBRARY_PATH: the run's loader is told, the scrubbed env would not say.
    assert binding.env()["LD_LIBRARY_PATH"] == str(elsewhere)


def test_a_gpu_run_is_bounded_by_what_it_allocates_not_by_address_space():
    limits = SandboxLimits(address_space_bytes=None, data_bytes=8 * 1024**3)
    prefix = prlimit_prefix(limits)
    assert "--as=unlimited" in prefix and f"--data={8 * 1024**3}" in prefix
    assert f"--as={4 * 1024**3}" in prlimit_prefix(SandboxLimits()) and not any(
        a.startswith("--data") for a in prlimit_prefix(SandboxLimits()))


def test_a_missing_node_is_looked_for_again_by_the_next_run(tmp_path, monkeypatch):
    from kope_mcp.runtime import sandbox_gpu

    dev = fake_dev(tmp_path, ("nvidia0", "nvidiactl"))
    monkeypatch.setattr(sandbox_gpu, "_bound", {})
    monkeypatch.setattr(sandbox_gpu, "gpu_binding", lambda index, per_run_uid: gpu_binding(
        index, per_run_uid=per_run_uid, dev=dev, listing="", maps=""))
    assert "nvidia-uvm" in str(sandbox_gpu.assigned_gpu(0, False))
    (dev / "nvidia-uvm").symlink_to("/dev/null")  # the driver created it meanwhile
    found = sandbox_gpu.assigned_gpu(0, False)
    assert isinstance(found, GpuBinding) and found.nodes[-1] == str(dev / "nvidia-uvm")
