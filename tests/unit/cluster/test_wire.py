"""The cluster's wire format: every call of the contract round-trips as plain data, and anything that is not what
the reader expects (another shape, an object dtype, a cut blob, an unknown error class) is refused, never run."""

from __future__ import annotations

import json
import pickle
import struct

import numpy as np
import pytest

from kope_mcp.cluster import wire
from kope_mcp.cluster.device_actor import CALLS, DeviceDescription, TaskBundle
from kope_mcp.cluster.driver import Reply, Request
from kope_mcp.diagnostics import Diagnostic
from kope_mcp.errors import BuildTamperedError, DeviceLostError
from kope_mcp.hardware import CacheLevel, HardwareProfile
from kope_mcp.models import CostCounts
from kope_mcp.targets.base import CompileOptions, Measurement, TargetStatus
from kope_mcp.targets.builds import BuildResult
from kope_mcp.targets.native_runner import HarnessOutcome, PreparedCase
from kope_mcp.targets.timing import CorroboratedTimings

HARDWARE = HardwareProfile(key="x86_64/cpu/2c/avx2", arch="x86_64", cpu_model="cpu", cores=2, isa=["avx2"],
                           caches=[CacheLevel(level=3, type="unified", size_kib=32768, shared_by_cpus=2)])


def _case() -> PreparedCase:
    return PreparedCase(name="drawn", sizes={"n": 5}, inputs={
        "x": np.linspace(0, 1, 5, dtype=np.float32), "idx": np.arange(6, dtype=np.int64).reshape(2, 3)[:, ::2],
        "alpha": np.array(0.5), "mask": np.array([True, False]), "empty": np.zeros((0, 4), dtype=np.float16)})


def _equal(a: object, b: object) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            _equal(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _equal(x, y)
    elif hasattr(a, "__dataclass_fields__"):
        assert type(a) is type(b)
        _equal(vars(a), vars(b))
    else:
        assert a == b


def test_every_call_of_the_contract_round_trips_its_arguments_and_its_answer():
    bundle = TaskBundle(task_id="relu", files={"task.toml": b"id = 'relu'\n", "ref/reference.py": bytes(range(256))})
    outcome = HarnessOutcome(status="ok", result={"case": "drawn", "times": [1.5, 2]}, outputs=[{"y": np.ones(3)}],
                             timings=CorroboratedTimings(samples={"kernel": [1e-3, 2e-3]}, inner={"kernel": 4}),
                             variant_seed=7, variants=[(0, 1), (1, 0)])
    arguments = {
        "compile": (bundle, "void f(void) {}", ["-O2"], CompileOptions(target_arch="sm_90")),
        "check_build": ("abc",),
        "run_cases": (bundle, "abc", [_case(), _case()], 12.5),
        "profile": (bundle, "abc", [_case()], True, 4.0, (0.1, 0.2), 30.0),
        "deterministic_costs": (bundle, "abc", _case()),
    }
    answers = {
        "compile": BuildResult(build_hash="abc", ok=False, diagnostics=[Diagnostic(line=3, column=1,
                               severity="error", message="expected ';'")], log="log", seconds=0.5, cached=False,
                               artifact=None, flags=["-O2"], sha256="ff", traits={"openmp": True}),
        "check_build": None,
        "run_cases": outcome,
        "profile": Measurement(outcome=outcome, baseline_key="baseline", pinned_cpu=1, warnings=["w"]),
        "deterministic_costs": CostCounts(tool="callgrind", instructions=10, data_reads=2),
    }
    assert set(arguments) == set(CALLS) == set(answers)
    for method, (argument_type, answer_type) in CALLS.items():
        _equal(wire.decode(wire.encode(list(arguments[method])), argument_type), arguments[method])
        _equal(wire.decode(wire.encode(answers[method]), answer_type), answers[method])
    assert wire.decode(wire.encode("no valgrind"), CALLS["deterministic_costs"][1]) == "no valgrind"
    described = DeviceDescription(worker="w", backend="c", host="h", status=TargetStatus(True, True, True, "ok",
                                  details=("a", "b")), hardware=HARDWARE, roofline=None, niceness=0)
    _equal(wire.decode(wire.encode(described), DeviceDescription), described)


def test_arrays_read_back_are_writable_and_keep_dtype_and_shape():
    decoded = wire.decode(wire.encode(_case()), PreparedCase)
    assert decoded.inputs["alpha"].shape == () and decoded.inputs["idx"].shape == (2, 2)
    decoded.inputs["x"][0] = 9.0  # the server writes into outputs it reads back, as into its own
    assert decoded.inputs["x"][0] == 9.0


def test_a_contract_error_comes_back_as_itself_and_anything_else_as_a_failure_naming_its_type():
    with pytest.raises(BuildTamperedError, match=r"^build_tampered: the build changed"):
        wire.decode(wire.encode_error(BuildTamperedError("the build changed")), BuildResult)
    with pytest.raises(wire.RemoteFailure, match=r"^ZeroDivisionError: division by zero"):
        wire.decode(wire.encode_error(ZeroDivisionError("division by zero")), BuildResult)
    forged = wire.encode({"type": "SystemExit", "detail": "bye"}, kind="error")  # not a kope error class
    with pytest.raises(wire.RemoteFailure, match=r"^SystemExit: bye"):
        wire.decode(forged, BuildResult)
    with pytest.raises(DeviceLostError):
        wire.decode(wire.encode_error(DeviceLostError("x")), type(None))


def _forge(header: dict[str, object], *blobs: bytes) -> bytes:
    text = json.dumps(header).encode()
    return wire.MAGIC + struct.pack("<Q", len(text)) + text + b"".join(blobs)


@pytest.mark.parametrize(("data", "expected", "complaint"), [
    (pickle.dumps({"kind": "ok"}), Reply, "not a kope message"),
    (wire.MAGIC + struct.pack("<Q", 10**9) + b"{}", Reply, "cut short or too large"),
    (_forge({"kind": "ok", "value": {"$nd": 0, "dtype": "|O", "shape": [1]}, "blobs": [8]}, b"\0" * 8),
     np.ndarray, "not a plain number type"),
    (_forge({"kind": "ok", "value": {"$nd": 0, "dtype": "<f8", "shape": [2]}, "blobs": [8]}, b"\0" * 8),
     np.ndarray, "do not make"),
    (_forge({"kind": "ok", "value": {"$nd": 0, "dtype": "<f8", "shape": [1]}, "blobs": [8]}, b"\0" * 4),
     np.ndarray, "cut short"),
    (_forge({"kind": "ok", "value": {"$nd": 3, "dtype": "<f8", "shape": [1]}, "blobs": [8]}, b"\0" * 8),
     np.ndarray, "reference to a blob"),
    (_forge({"kind": "ok", "value": {"id": 1, "kind": "ok", "extra": 1}, "blobs": []}), Reply, "unknown fields"),
    (_forge({"kind": "ok", "value": {"kind": "ok"}, "blobs": []}), Reply, "missing fields id"),
    (_forge({"kind": "ok", "value": {"id": True, "kind": "ok"}, "blobs": []}), Reply, "expected an integer"),
    (_forge({"kind": "ok", "value": {"status": "pwned"}, "blobs": []}), HarnessOutcome, "is not one of"),
    (_forge({"kind": "ok", "value": ["a"], "blobs": []}, b"x"), list[str], "bytes follow"),
    (_forge({"kind": "maybe", "value": None, "blobs": []}), type(None), "kind 'maybe'"),
])
def test_a_message_that_is_not_what_its_reader_expects_is_refused_with_what_was_wrong(data, expected, complaint):
    with pytest.raises(wire.WireError, match=complaint):
        wire.decode(data, expected)


def test_what_cannot_be_plain_data_is_refused_when_written():
    with pytest.raises(wire.WireError, match="plain data only"):
        wire.encode({"f": object()})
    with pytest.raises(wire.WireError, match="plain numbers only"):
        wire.encode(np.array([object()]))
    with pytest.raises(wire.WireError, match="keys that are not strings"):
        wire.encode({1: 2})


def test_the_pipe_messages_round_trip():
    request = Request(id=3, op="call", actor="device/a/c", method="profile", timeout_s=9.5, payload=b"\x00\xff")
    assert wire.decode(wire.encode(request), Request) == request
    reply = Reply(id=3, kind="ok", devices={"device/a/c": b"abc"}, refused={"device/x/c": "its class is m.X"})
    assert wire.decode(wire.encode(reply), Reply) == reply
