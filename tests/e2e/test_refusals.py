"""Wrong calls, as a model makes them, through the SDK's in-process Client: every answer starts with a stable
code and says what is valid, and nothing is stored for a refused call."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from mcp import Client

from kope_mcp.server import build_server
from tests.conftest import VECTOR_ADD_OK, make_settings

WRONG_CALLS: list[tuple[str, dict[str, Any], str, str]] = [
    ("get_task", {"task_id": "nope"}, "unknown_task:", "vector_add"),
    ("get_task", {}, "invalid_argument:", "`task_id` is required"),
    ("get_task", {"task_id": 5}, "invalid_argument:", "(got 5)"),
    ("list_tasks", {"level": 9}, "invalid_argument:", "less than or equal to 4"),
    ("list_tasks", {"family": "nope"}, "unknown_family:", "matmul"),
    ("compile_kernel", {"task_id": "vector_add", "source": VECTOR_ADD_OK, "flags": "-O3"}, "invalid_argument:",
     "`flags`"),
    ("compile_kernel", {"task_id": "vector_add", "source": VECTOR_ADD_OK, "flags": ["-o/etc/passwd"]},
     "refused_flag:", "Allowed"),
    ("compile_kernel", {"task_id": "vector_add", "source": "   \n"}, "empty_source:", "C source"),
    ("compile_kernel", {"task_id": "vector_add", "source": VECTOR_ADD_OK, "strategy": "x" * 5000}, "too_long:",
     "at most 200"),
    ("compile_kernel", {"task_id": "vector_add", "source": VECTOR_ADD_OK, "backend": "opencl"},
     "unknown_backend:", "c, cuda, triton"),
    ("compile_kernel", {"task_id": "vector_add", "source": VECTOR_ADD_OK, "target_arch": "sm_90"},
     "refused_flag:", "target_arch"),
    ("compile_kernel", {"task_id": "vector_add", "source": VECTOR_ADD_OK, "session_id": "s-nope"},
     "unknown_session:", "omit session_id"),
    ("compile_kernel", {"task_id": "vector_add", "source": VECTOR_ADD_OK, "parent_id": "k-nope"},
     "unknown_kernel:", "compile_kernel"),
    ("run_tests", {"kernel_id": "k-nope"}, "unknown_kernel:", "compile_kernel"),
    ("profile_kernel", {"kernel_id": "k-nope"}, "unknown_kernel:", "compile_kernel"),
    ("record_experience", {"strategy": "unroll", "lesson": "y" * 5000}, "too_long:", "at most 4,000"),
    ("record_experience", {"strategy": "", "lesson": "text"}, "empty_lesson:", "strategy"),
    ("query_experience", {"query": "x", "token_budget": 0}, "invalid_argument:", "greater than or equal to 1"),
    ("query_experience", {"query": "x", "agent_mode": "all"}, "invalid_argument:", "'prefer' or 'only'"),
    ("no_such_tool", {}, "unknown_tool:", "compile_kernel"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    return build_server(make_settings(tmp_path_factory.mktemp("refusals-home")))


@pytest.mark.parametrize("tool, arguments, code, detail", WRONG_CALLS,
                         ids=[f"{t}-{c.rstrip(':')}-{i}" for i, (t, _, c, _) in enumerate(WRONG_CALLS)])
def test_a_wrong_call_gets_its_code_first_and_stores_nothing(server, tool, arguments, code, detail):
    async def body():
        async with Client(server) as client:
            before = json.loads((await client.read_resource("kope://memory/stats")).contents[0].text)["counts"]
            result = await client.call_tool(tool, arguments)
            assert result.is_error
            text = result.content[0].text
            assert text.startswith(code), text
            assert detail in text, text
            assert "pydantic.dev" not in text and "Error executing tool" not in text
            after = json.loads((await client.read_resource("kope://memory/stats")).contents[0].text)["counts"]
            assert after == before
    anyio.run(body)
