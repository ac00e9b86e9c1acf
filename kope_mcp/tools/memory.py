"""record_experience, query_experience and the memory statistics resource."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations
from pydantic import Field

from kope_mcp.memory.admin import memory_stats
from kope_mcp.models import Phase, QueryResult, RecordResult
from kope_mcp.tools._context import AGENT_LABEL_DOC, APPENDS, AppState, LiveState, agent_info, app_state, call_service
from kope_mcp.tools.views import ui_meta
from kope_mcp.views import EXPERIENCE_URI


def register(server: MCPServer[Any], live: LiveState) -> None:
    @server.tool(
        name="record_experience",
        title="Record what you tried and learned",
        annotations=APPENDS,
    )
    async def record_experience(
        ctx: Context[AppState],
        strategy: Annotated[str, Field(description="The optimisation, e.g. 'blocking 64x64 for L1'.")],
        lesson: Annotated[str, Field(description="What you learned, in one or two sentences, for future attempts.")],
        kernel_id: Annotated[str | None, Field(
            description="The attempt this is about; its measured outcome is attached and cannot be overridden."
        )] = None,
        session_id: Annotated[str | None, Field(
            description="The session_id compile_kernel gave you: it proves the attempt is yours, so your lesson "
                        "is verified by its measurement (without it, your words are stored as a claim about the "
                        "attempt); alone, it scopes a lesson to the session's task.")] = None,
        task_id: Annotated[str | None, Field(description="Scope a lesson to this task.")] = None,
        opt_layer: Annotated[str | None, Field(
            description="Where the change acts: algorithm, memory, parallelism, vectorisation, compiler...")] = None,
        rationale: Annotated[str | None, Field(description="Why you expected it to help.")] = None,
        hardware: Annotated[str | None, Field(description="Hardware key this knowledge applies to.")] = None,
        agent: Annotated[str | None, Field(description=AGENT_LABEL_DOC)] = None,
    ) -> RecordResult:
        """Record the why behind a step: strategy, rationale and the lesson. Outcomes of compile/test/profile are
        already recorded automatically; this adds the explanation future attempts (yours or another agent's) need.
        With kernel_id the label and speedup come from the measurements; pass the session_id compile_kernel gave
        you too, or the lesson is stored as a claim, not verified. Without kernel_id the lesson is stored as
        unverified and ranks below measured evidence. Next: query_experience before your next attempt.
        """
        return await call_service(ctx, app_state(ctx).experience.record_experience, strategy=strategy, lesson=lesson,
                                  kernel_id=kernel_id, session_id=session_id, task_id=task_id, opt_layer=opt_layer,
                                  rationale=rationale, hardware=hardware, agent=agent_info(ctx, agent))

    @server.tool(
        name="query_experience",
        title="Get the most relevant experience",
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
        meta=ui_meta(EXPERIENCE_URI),
    )
    async def query_experience(
        ctx: Context[AppState],
        query: Annotated[str, Field(description="What you are about to do or stuck on, in words (cut at 2000 chars).")],
        task_id: Annotated[str | None, Field(description="The task you work on.")] = None,
        session_id: Annotated[str | None, Field(
            description="Your session: adds the latest feedback and incumbent, and infers the phase.")] = None,
        phase: Annotated[Phase | None, Field(
            description="start | compile_error | incorrect | optimize; inferred from the session when omitted.")
        ] = None,
        hardware: Annotated[str | None, Field(description="Hardware key; default: this server's machine.")] = None,
        token_budget: Annotated[int, Field(ge=1, le=100_000, description="Most tokens of context to return.")] = 2000,
        agent: Annotated[str | None, Field(
            description="An agent (client name or label, matched as a case-insensitive substring) whose "
                        "experience to prefer or keep; default: everyone's, ranked only by evidence.")] = None,
        agent_mode: Annotated[Literal["prefer", "only"], Field(
            description="With agent: 'prefer' ranks that agent's items higher; 'only' drops everyone else's.")
        ] = "prefer",
        backend: Annotated[str | None, Field(
            description="The backend you write for (c, triton, cuda): its experience ranks above other backends'. "
                        "Default: your session's backend.")] = None,
    ) -> QueryResult:
        """Active context selection: the experience most relevant to your state, ranked by measured outcome and
        packed into token_budget. Stuck on a compile error or wrong results, you get the fixes that resolved the
        same failure before; correct but slow, the strategies with the best measured gains on this family and
        hardware; always, pitfalls to avoid. Returns `context` (markdown to put in your prompt) and the items with
        why each was chosen (including which agent produced it). Experience from every client and model sharing
        this memory is used by default; pass agent to prefer or keep one agent's. Call it before every new attempt.
        """
        return await call_service(ctx, app_state(ctx).experience.query_experience, query=query, task_id=task_id,
                                  session_id=session_id, phase=phase, hardware=hardware, token_budget=token_budget,
                                  agent=agent, agent_mode=agent_mode, backend=backend)

    @server.resource("kope://memory/history", name="memory_history", title="The whole experience memory",
                     mime_type="text/markdown")
    def memory_history_resource() -> str:
        """Every recorded attempt and lesson, one line each, oldest first. Large: prefer query_experience, which
        selects what matters for your current state within a token budget."""
        return live.get().experience.history().context

    @server.resource("kope://memory/history.json", name="memory_history_json",
                     title="The whole experience memory, with the data behind each line",
                     mime_type="application/json")
    def memory_history_json_resource() -> str:
        """kope://memory/history as data: the markdown, and per line its span, kind, strategy, label, speedup,
        task, family and hardware (the fields of query_experience's items). For programs, not prompts."""
        return live.get().experience.history().model_dump_json()

    @server.resource("kope://memory/stats", name="memory_stats", title="Experience memory statistics",
                     mime_type="application/json")
    def memory_stats_resource() -> str:
        """Counts of tasks, sessions, attempts by label, strategies and lessons in the experience graph."""
        return json.dumps(memory_stats(live.get().workbench.memory).model_dump(), indent=1)
