"""Wrong calls, as models make them: (tool, arguments, the code the answer must start with, a detail it must name).
One table for every way in: the in-process Client, a real stdio `kope serve` and the daemon's HTTP transport."""

from __future__ import annotations

from typing import Any

from tests.conftest import VECTOR_ADD_OK

S = VECTOR_ADD_OK
VA = {"task_id": "vector_add", "source": S}

WRONG_CALLS: list[tuple[str, dict[str, Any], str, str]] = [
    # finding tasks
    ("get_task", {"task_id": "nope"}, "unknown_task:", "vector_add"),
    ("get_task", {"task_id": ""}, "unknown_task:", "valid task ids"),
    ("get_task", {}, "invalid_argument:", "`task_id` is required"),
    ("get_task", {"task_id": 5}, "invalid_argument:", "(got 5)"),
    ("list_tasks", {"level": 9}, "invalid_argument:", "less than or equal to 4"),
    ("list_tasks", {"level": 0}, "invalid_argument:", "greater than or equal to 1"),
    ("list_tasks", {"level": "x"}, "invalid_argument:", "valid integer"),
    ("list_tasks", {"family": "nope"}, "unknown_family:", "matmul"),
    ("list_tasks", {"level": "2"}, "invalid_argument:", "valid integer"),
    ("list_tasks", {"level": 2.5}, "invalid_argument:", "`level`"),
    ("get_task", {"task_id": "vector_add", "bogus": 1}, "invalid_argument:", "`bogus` is not an argument"),
    # compiling
    ("compile_kernel", {"source": S}, "invalid_argument:", "`task_id` is required"),
    ("compile_kernel", {"task_id": "vector_add"}, "invalid_argument:", "`source` is required"),
    ("compile_kernel", {"task_id": "nope", "source": S}, "unknown_task:", "vector_add"),
    ("compile_kernel", {"task_id": "vector_add", "source": 5}, "invalid_argument:", "`source`"),
    ("compile_kernel", {**VA, "flags": "-O3"}, "invalid_argument:", "`flags`"),
    ("compile_kernel", {**VA, "flags": [5]}, "invalid_argument:", "`flags.0`"),
    ("compile_kernel", {**VA, "flags": ["-o/etc/passwd"]}, "refused_flag:", "Allowed"),
    ("compile_kernel", {**VA, "flags": ["-fplugin=/tmp/x.so"]}, "refused_flag:", "plugins"),
    ("compile_kernel", {**VA, "flags": ["-I/etc"]}, "refused_flag:", "relative path"),
    ("compile_kernel", {**VA, "flags": ["-include", "/etc/passwd"]}, "refused_flag:", "arbitrary files"),
    ("compile_kernel", {**VA, "flags": ["@/etc/passwd"]}, "refused_flag:", "response files"),
    ("compile_kernel", {**VA, "flags": ["-Wl,-rpath,/tmp"]}, "refused_flag:", "linker"),
    ("compile_kernel", {**VA, "flags": ["-B/tmp"]}, "refused_flag:", "other programs"),
    ("compile_kernel", {**VA, "flags": ["-specs=/tmp/x"]}, "refused_flag:", "Allowed"),
    ("compile_kernel", {"task_id": "vector_add", "source": "   \n"}, "empty_source:", "C source"),
    ("compile_kernel", {"task_id": "vector_add", "source": "x" * 300_000}, "source_too_large:", "262,144"),
    ("compile_kernel", {"task_id": "vector_add", "source": "x" * 5_000_000}, "source_too_large:", "bytes"),
    ("compile_kernel", {**VA, "strategy": "x" * 5000}, "too_long:", "at most 200"),
    ("compile_kernel", {**VA, "strategy": ["a"]}, "invalid_argument:", "`strategy`"),
    ("compile_kernel", {**VA, "agent": "a" * 5000}, "too_long:", "at most 80"),
    ("compile_kernel", {**VA, "backend": "opencl"}, "unknown_backend:", "c, cuda, triton"),
    ("compile_kernel", {**VA, "backend": ""}, "unknown_backend:", "c, cuda, triton"),
    ("compile_kernel", {**VA, "target_arch": "sm_90"}, "refused_flag:", "target_arch"),
    ("compile_kernel", {**VA, "backend": "cuda", "target_arch": "banana"}, "refused_flag:", "sm_90"),
    ("compile_kernel", {**VA, "session_id": "s-nope"}, "unknown_session:", "omit session_id"),
    ("compile_kernel", {**VA, "parent_id": "k-nope"}, "unknown_kernel:", "compile_kernel"),
    # testing and profiling
    ("run_tests", {"kernel_id": "k-nope"}, "unknown_kernel:", "compile_kernel"),
    ("run_tests", {"kernel_id": ""}, "unknown_kernel:", "k-1a2b3c4d5e6f"),
    ("run_tests", {}, "invalid_argument:", "`kernel_id` is required"),
    ("run_tests", {"kernel_id": 17}, "invalid_argument:", "(got 17)"),
    ("profile_kernel", {"kernel_id": "k-nope"}, "unknown_kernel:", "compile_kernel"),
    ("profile_kernel", {}, "invalid_argument:", "`kernel_id` is required"),
    ("profile_kernel", {"kernel_id": "k-nope", "deterministic": "maybe"}, "invalid_argument:", "`deterministic`"),
    ("profile_kernel", {"kernel_id": "k-nope", "deterministic": "yes"}, "invalid_argument:", "valid boolean"),
    ("profile_kernel", {"kernel_id": "k-nope", "time_reference": 0}, "invalid_argument:", "`time_reference`"),
    ("profile_kernel", {"kernel_id": "k-nope", "repeat": 3}, "invalid_argument:", "kernel_id, time_reference"),
    # recording
    ("record_experience", {"strategy": "unroll", "lesson": "y" * 5000}, "too_long:", "at most 4,000"),
    ("record_experience", {"strategy": "", "lesson": "text"}, "empty_lesson:", "strategy"),
    ("record_experience", {"strategy": "s", "lesson": "   "}, "empty_lesson:", "lesson"),
    ("record_experience", {"lesson": "l"}, "invalid_argument:", "`strategy` is required"),
    ("record_experience", {"strategy": "s" * 300, "lesson": "l"}, "too_long:", "at most 200"),
    ("record_experience", {"strategy": "s", "lesson": "l", "rationale": "r" * 5000}, "too_long:", "`rationale`"),
    ("record_experience", {"strategy": "s", "lesson": "l", "opt_layer": "o" * 300}, "too_long:", "`opt_layer`"),
    ("record_experience", {"strategy": "s", "lesson": "l", "hardware": "h" * 300}, "too_long:", "`hardware`"),
    ("record_experience", {"strategy": "s", "lesson": "l", "kernel_id": "k-nope"}, "unknown_kernel:", "k-"),
    ("record_experience", {"strategy": "s", "lesson": "l", "session_id": "s-nope"}, "unknown_session:", "omit"),
    ("record_experience", {"strategy": "s", "lesson": "l", "task_id": "nope"}, "unknown_task:", "vector_add"),
    # querying
    ("query_experience", {}, "invalid_argument:", "`query` is required"),
    ("query_experience", {"query": "x", "token_budget": 0}, "invalid_argument:", "greater than or equal to 1"),
    ("query_experience", {"query": "x", "token_budget": "lots"}, "invalid_argument:", "`token_budget`"),
    ("query_experience", {"query": "x", "token_budget": "500"}, "invalid_argument:", "`token_budget`"),
    ("query_experience", {"query": "x", "agent_mode": "all"}, "invalid_argument:", "'prefer' or 'only'"),
    ("query_experience", {"query": "x", "phase": "debug"}, "invalid_argument:", "'optimize'"),
    ("query_experience", {"query": "x", "task_id": "nope"}, "unknown_task:", "vector_add"),
    ("query_experience", {"query": "x", "session_id": "s-nope"}, "unknown_session:", "omit"),
    ("query_experience", {"query": "x", "backend": "opencl"}, "unknown_backend:", "c, cuda, triton"),
    ("no_such_tool", {}, "unknown_tool:", "compile_kernel"),
]


def call_ids() -> list[str]:
    return [f"{tool}-{code.rstrip(':')}-{i}" for i, (tool, _, code, _) in enumerate(WRONG_CALLS)]


def bad_answer(text: str, code: str, detail: str) -> str | None:
    """Why an answer's text is not the one a model can act on, or None when it is."""
    if not text.startswith(code):
        return f"does not start with {code!r}"
    if detail not in text:
        return f"does not name {detail!r}"
    if "pydantic.dev" in text or "Error executing tool" in text:
        return "carries library text"
    return None
