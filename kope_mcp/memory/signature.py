"""Normalised error signatures: the same mistake on another line or variable name gives the same signature."""

from __future__ import annotations

import re

_QUOTED = re.compile(r"[‘'`\"“]([^’'`\"”]*)[’'`\"”]")
_NUMBER = re.compile(r"\b\d+(\.\d+)?\b")
_SPACES = re.compile(r"\s+")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b")


def normalise_message(message: str) -> str:
    text = _QUOTED.sub("'X'", message.lower())
    text = _HEX.sub("N", text)
    text = _NUMBER.sub("N", text)
    return _SPACES.sub(" ", text).strip()[:160]


def compile_signature(first_error: str | None) -> str | None:
    return f"compile: {normalise_message(first_error)}" if first_error else None


def failure_signature(failure: str | None, message: str, unwritten: int = 0) -> str | None:
    """e.g. 'test:mismatch:unwritten', 'test:crash:SIGSEGV', 'test:timeout'."""
    if failure is None or failure == "not_compiled":
        return None
    detail = ""
    if failure == "mismatch":
        detail = ":unwritten" if unwritten else ":values"
    elif failure == "crash":
        found = re.search(r"\b(SIG[A-Z]+)\b", message)
        detail = f":{found.group(1)}" if found else (":fork" if "child process" in message else
                                                     ":exit" if "instead of returning" in message else "")
    return f"test:{failure}{detail}"
