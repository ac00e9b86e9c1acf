"""What crosses between a worker's device, the server's Ray driver child and the server: plain data with a schema,
never code.

A pickle runs whatever its writer chose when it is read, and whoever holds the cluster token can write one. So a
message here is a JSON header plus raw byte blobs (arrays and file contents), and it is read back only into the
type the reader expects: every field checked against that type's annotations (dataclasses, pydantic models, lists,
dicts with string keys, tuples, literals, optionals), arrays only of plain numeric dtypes whose size matches their
blob. Anything else is a ``WireError``, which the reader treats as a device that answered nonsense.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import struct
import types
import typing
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from kope_mcp import errors

MAGIC = b"KOPW1\n"
_HEAD = struct.Struct("<Q")
HEADER_LIMIT = 64 * 1024**2  # JSON without arrays: logs, diagnostics, timings; far below this
_DTYPES = frozenset(["|b1", "<i1", "<i2", "<i4", "<i8", "|i1", "|u1", "<u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8"])
_DETAIL_LIMIT = 4000


class WireError(ValueError):
    """A message that is not what its reader expects: malformed, of another shape, or too large."""


class RemoteFailure(Exception):
    """The device failed with something that is not a contract outcome (its own bug, a broken install)."""


# --- writing --------------------------------------------------------------------------------------------------------
def encode(value: Any, kind: str = "ok") -> bytes:
    blobs: list[memoryview] = []
    body = _plain(value, blobs)
    header = json.dumps({"kind": kind, "value": body, "blobs": [b.nbytes for b in blobs]},
                        separators=(",", ":")).encode()
    return b"".join([MAGIC, _HEAD.pack(len(header)), header, *blobs])


def encode_error(exc: BaseException) -> bytes:
    """A contract error (a ``KopeError``: a tampered build, a bad task) as its class and detail; anything else as a
    failure that names its type. Never the exception object itself."""
    if isinstance(exc, errors.KopeError):
        return encode({"type": type(exc).__name__, "detail": exc.detail[:_DETAIL_LIMIT]}, kind="error")
    return encode({"type": type(exc).__name__, "detail": first_line(exc)}, kind="failed")


def first_line(exc: BaseException) -> str:
    """An exception's first line, cut to 300 characters: what a one-line answer about it carries."""
    return (str(exc).strip().splitlines() or [""])[0][:300]


def _plain(value: Any, blobs: list[memoryview]) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        array = value if value.flags.c_contiguous else value.copy(order="C")  # not ascontiguousarray: 0-d stays
        if array.dtype.str not in _DTYPES:
            raise WireError(f"an array of dtype {array.dtype} cannot be sent (plain numbers only)")
        blobs.append(memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b""))  # type: ignore[arg-type]
        return {"$nd": len(blobs) - 1, "dtype": array.dtype.str, "shape": list(array.shape)}
    if isinstance(value, (bytes, bytearray)):
        blobs.append(memoryview(bytes(value)))
        return {"$b": len(blobs) - 1}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), blobs) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise WireError("a mapping with keys that are not strings cannot be sent")
        return {k: _plain(v, blobs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, blobs) for v in value]
    raise WireError(f"a {type(value).__name__} cannot be sent (plain data only)")


# --- reading --------------------------------------------------------------------------------------------------------
def decode(data: bytes | bytearray | memoryview, expected: Any) -> Any:
    """The value in ``data`` as ``expected``; a contract error the device raised is raised here as itself."""
    kind, value, blobs = _open(data)
    if kind == "ok":
        return _build(value, expected, blobs, "the answer")
    if kind not in ("error", "failed"):
        raise WireError(f"a message of kind {kind[:20]!r}")
    detail = _build(value, dict[str, str], blobs, "the error")
    if kind == "error":
        cls = _kope_errors().get(detail.get("type", ""))
        if cls is not None:
            return _raise(errors.rebuild_error(cls, detail.get("detail", "")[:_DETAIL_LIMIT]))
    raise RemoteFailure(f"{detail.get('type', 'error')[:80]}: {detail.get('detail', '')[:300]}")


def _raise(exc: Exception) -> Any:
    raise exc


def _open(data: bytes | bytearray | memoryview) -> tuple[str, Any, list[memoryview]]:
    # One writable copy: arrays read back are views into it, and the server may write to them like its own.
    buffer = memoryview(bytearray(data))
    if buffer[: len(MAGIC)] != MAGIC or len(buffer) < len(MAGIC) + _HEAD.size:
        raise WireError("not a kope message")
    (size,) = _HEAD.unpack_from(buffer, len(MAGIC))
    start = len(MAGIC) + _HEAD.size
    if size > HEADER_LIMIT or start + size > len(buffer):
        raise WireError("its header is cut short or too large")
    try:
        header = json.loads(bytes(buffer[start:start + size]))
    except (ValueError, UnicodeDecodeError):
        raise WireError("its header is not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("kind"), str) or "value" not in header:
        raise WireError("its header has no kind and value")
    sizes = header.get("blobs")
    if not isinstance(sizes, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                              for n in sizes):
        raise WireError("its blob table is not a list of sizes")
    offset, blobs = start + size, []
    for n in sizes:
        if offset + n > len(buffer):
            raise WireError("a blob is cut short")
        blobs.append(buffer[offset:offset + n])
        offset += n
    if offset != len(buffer):
        raise WireError("bytes follow its last blob")
    return header["kind"], header["value"], blobs


@functools.cache
def _kope_errors() -> dict[str, type[errors.KopeError]]:
    found: dict[str, type[errors.KopeError]] = {}
    pending: list[type[errors.KopeError]] = [errors.KopeError]
    while pending:
        cls = pending.pop()
        if cls.__module__.startswith("kope_mcp."):
            found[cls.__name__] = cls
        pending.extend(cls.__subclasses__())
    return found


@functools.cache
def _fields(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(value: Any, expected: Any, blobs: list[memoryview], where: str) -> Any:
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is Any:
        return _json_only(value, where)
    if expected is None or expected is type(None):
        if value is not None:
            raise WireError(f"{where}: expected nothing, got {type(value).__name__}")
        return None
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _build(value, option, blobs, where)
            except WireError as exc:
                problems.append(str(exc))
        raise WireError(problems[0] if len(problems) == 1 else f"{where}: fits none of its types ({problems[0]})")
    if origin is typing.Literal:
        if value not in args or type(value) not in {type(a) for a in args}:
            raise WireError(f"{where}: {str(value)[:40]!r} is not one of {', '.join(map(repr, args))}")
        return value
    if expected is bool:
        return _check(value, bool, where)
    if expected is int:
        if isinstance(value, bool):
            raise WireError(f"{where}: expected an integer, got a boolean")
        return _check(value, int, where)
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise WireError(f"{where}: expected a number, got {type(value).__name__}")
        return float(value)
    if expected is str:
        return _check(value, str, where)
    if expected is Path:
        return Path(_check(value, str, where))
    if expected is bytes:
        return bytes(blobs[_blob(value, "$b", blobs, where)])
    if expected is np.ndarray:
        return _array(value, blobs, where)
    if origin is list:
        return [_build(v, args[0], blobs, f"{where}[{i}]") for i, v in enumerate(_check(value, list, where))]
    if origin is tuple:
        items = _check(value, list, where)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(v, args[0], blobs, f"{where}[{i}]") for i, v in enumerate(items))
        if len(items) != len(args):
            raise WireError(f"{where}: expected {len(args)} items, got {len(items)}")
        return tuple(_build(v, a, blobs, f"{where}[{i}]") for i, (v, a) in enumerate(zip(items, args, strict=True)))
    if origin is dict:
        if args[0] is not str:
            raise WireError(f"{where}: only mappings with string keys are read")
        return {k: _build(v, args[1], blobs, f"{where}.{k}") for k, v in _check(value, dict, where).items()}
    if isinstance(expected, type) and issubclass(expected, BaseModel):
        try:
            return expected.model_validate(value)
        except ValidationError as exc:
            raise WireError(f"{where}: {str(exc).splitlines()[0]}") from None
    if isinstance(expected, type) and dataclasses.is_dataclass(expected):
        fields = _check(value, dict, where)
        hints = _fields(expected)
        known = {f.name: f for f in dataclasses.fields(expected) if f.init}
        if unknown := set(fields) - set(known):
            raise WireError(f"{where}: unknown fields {', '.join(sorted(unknown))[:200]}")
        missing = [name for name, f in known.items() if name not in fields and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise WireError(f"{where}: missing fields {', '.join(missing)}")
        return expected(**{k: _build(v, hints[k], blobs, f"{where}.{k}") for k, v in fields.items()})
    raise WireError(f"{where}: the reader has no rule for {expected!r}")


def _check(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind):
        raise WireError(f"{where}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _blob(value: Any, tag: str, blobs: list[memoryview], where: str) -> int:
    if not isinstance(value, dict) or not isinstance(value.get(tag), int) or not 0 <= value[tag] < len(blobs):
        raise WireError(f"{where}: expected a reference to a blob")
    index: int = value[tag]
    return index


def _array(value: Any, blobs: list[memoryview], where: str) -> np.ndarray:
    blob = blobs[_blob(value, "$nd", blobs, where)]
    dtype, shape = value.get("dtype"), value.get("shape")
    if dtype not in _DTYPES:
        raise WireError(f"{where}: dtype {str(dtype)[:20]!r} is not a plain number type")
    if not isinstance(shape, list) or len(shape) > 8 or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise WireError(f"{where}: its shape is not a list of sizes")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count * np.dtype(dtype).itemsize != blob.nbytes:
        raise WireError(f"{where}: {blob.nbytes} bytes do not make a {dtype} array of shape {tuple(shape)}")
    return np.frombuffer(blob, dtype=np.dtype(dtype)).reshape(shape)


def _json_only(value: Any, where: str, depth: int = 0) -> Any:
    if depth > 32:
        raise WireError(f"{where}: nested too deep")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_json_only(v, where, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: _json_only(v, where, depth + 1) for k, v in value.items()}
    raise WireError(f"{where}: not plain data")
