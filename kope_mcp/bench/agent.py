"""A scripted agent that works the KOPE loop through the MCP tools only: query -> choose -> compile -> test ->
profile -> record, keeping the incumbent only when a correct candidate is measurably faster.

Policies differ only in what they read before choosing:
- ``none``: nothing; a seeded random order of strategies;
- ``passive``: the whole memory (resource kope://memory/history) every iteration, as an agent that pastes its
  entire history into its own context;
- ``active``: query_experience with a token budget (active context selection).
``passive`` and ``active`` parse what they read with the same code (the context lines the server renders),
so the difference is what the memory hands them, not how they read it.
"""

from __future__ import annotations

import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

from mcp import Client

from kope_mcp.bench.candidates import BY_NAME, CHOICES, Kernel
from kope_mcp.memory.tokens import count_tokens

POLICIES = ("none", "passive", "active")
ACTIVE_BUDGET = 2000

_CASE = re.compile(r"^- \[(?P<label>[\w-]+), step x(?P<step>[\d.]+), (?P<speedup>[\d.]+)x vs naive, confidence "
                   r"(?P<conf>[\d.]+)\] (?P<task>[\w-]+)(?: \((?P<family>[\w-]+)\))?: (?P<strategy>.+?); flags", re.M)
_FIXED = re.compile(r"^- (?P<task>[\w-]+)(?: \((?P<family>[\w-]+)\))?: (?P<strategy>.+?) failed with `", re.M)
_AVOID = re.compile(r"^- AVOID (?P<strategy>.+?) on (?P<task>[\w-]+)(?: \((?P<family>[\w-]+)\))?: "
                    r"(?P<outcome>.+?) \(k-", re.M)


class ToolFailed(RuntimeError):
    pass


@dataclass
class TaskRun:
    task_id: str
    family: str
    policy: str
    seed: int
    budget: int
    attempts: int = 0
    first_correct: int | None = None
    best_speedup: float = 1.0
    best_by_attempt: list[float] = field(default_factory=list)
    context_tokens: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    strategies: list[str] = field(default_factory=list)

    @property
    def solved(self) -> bool:
        return self.first_correct is not None


def evidence(context: str, family: str, task_id: str) -> dict[str, float]:
    """A score per strategy from rendered memory: measured steps (log of the step ratio, weighted by confidence,
    counted double on this family) minus failures. Unknown strategies are absent (score 0)."""
    scores: dict[str, float] = {}
    for m in _CASE.finditer(context):
        name = m["strategy"].strip().lower()
        weight = float(m["conf"]) * (2.0 if (m["family"] or family) == family or m["task"] == task_id else 0.5)
        scores[name] = scores.get(name, 0.0) + weight * math.log(max(float(m["step"]), 1e-3))
    for m in _AVOID.finditer(context):
        name = m["strategy"].strip().lower()
        local = (m["family"] or family) == family or m["task"] == task_id
        broken = m["outcome"].startswith(("did not compile", "wrong results"))
        scores[name] = scores.get(name, 0.0) - (1.0 if broken else 0.3) * (1.0 if local else 0.4)
    for m in _FIXED.finditer(context):
        # It broke, though it could be repaired: an attempt lost, and the repair may still not pay off.
        name = m["strategy"].strip().lower()
        local = (m["family"] or family) == family or m["task"] == task_id
        scores[name] = scores.get(name, 0.0) - 0.5 * (1.0 if local else 0.4)
    return scores


def order(policy: str, context: str | None, family: str, task_id: str, rng: random.Random,
          tried: set[str]) -> list[str]:
    """Strategies to try next, best first."""
    untried = [s for s in CHOICES if s not in tried]
    rng.shuffle(untried)  # the seeded tie-break (and the whole order for `none`)
    if policy == "none" or not context:
        return untried
    scores = evidence(context, family, task_id)
    return sorted(untried, key=lambda s: -scores.get(s.lower(), 0.0))


async def call_tool(client: Client, name: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    if result.is_error or result.structured_content is None:
        raise ToolFailed(f"{name}: {getattr(result.content[0], 'text', '?') if result.content else '?'}")
    return result.structured_content


async def _read_context(client: Client, policy: str, task_id: str, session_id: str | None,
                        run: TaskRun) -> str | None:
    if policy == "none":
        return None
    if policy == "passive":
        text = "".join(getattr(c, "text", "") for c in (await client.read_resource("kope://memory/history")).contents)
        run.context_tokens += count_tokens(text)  # the same estimate query_experience reports
        return text
    args: dict[str, Any] = {"query": f"what makes {task_id} faster and what breaks it", "task_id": task_id,
                            "token_budget": ACTIVE_BUDGET}
    if session_id:
        args["session_id"] = session_id
    answer = await call_tool(client, "query_experience", **args)
    run.context_tokens += int(answer["tokens_used"])
    return str(answer["context"])


async def run_task(client: Client, task_id: str, policy: str, budget: int, seed: int) -> TaskRun:
    """Work one task with `budget` attempts; every outcome goes through (and into) the server's memory."""
    started = time.monotonic()
    task = await call_tool(client, "get_task", task_id=task_id)
    run = TaskRun(task_id=task_id, family=task["family"], policy=policy, seed=seed, budget=budget)
    rng = random.Random(f"{seed}/{policy}/{task_id}")
    incumbent = Kernel(task["baseline_source"] or "", ())
    # The naive kernel is compiled first (not an attempt: it is where every task starts) so that candidates name
    # it as their parent. Without a parent the server links a candidate to the session's latest attempt, and a
    # failure would look "fixed" by whatever unrelated strategy came next.
    incumbent_id: str | None = None
    session_id: str | None = None
    if incumbent.source:
        root = await call_tool(client, "compile_kernel", task_id=task_id, source=incumbent.source,
                           strategy="naive baseline", agent="scripted")
        incumbent_id, session_id = root["kernel_id"], root["session_id"]
    tried: set[str] = set()
    pending: tuple[str, Kernel, str] | None = None  # a fix to apply to the candidate that failed, and its id
    while run.attempts < budget:
        parent_id = incumbent_id
        if pending is not None:
            (name, base, parent_id), pending = pending, None
        else:
            context = await _read_context(client, policy, task_id, session_id, run)
            name = next((s for s in order(policy, context, run.family, task_id, rng, tried)
                         if BY_NAME[s].apply(incumbent) is not None), "")
            if not name:
                break  # nothing left that applies
            base = incumbent
        tried.add(name)
        strategy = BY_NAME[name]
        candidate = strategy.apply(base)
        if candidate is None:
            continue
        run.attempts += 1
        run.strategies.append(name)
        outcome, kernel_id, session_id, speedup = await attempt(client, task_id, candidate, name, session_id,
                                                                  parent_id, run.best_speedup)
        run.outcomes[outcome] = run.outcomes.get(outcome, 0) + 1
        if outcome == "compile_error" and strategy.fix:
            pending = (strategy.fix, candidate, kernel_id)
        if outcome in ("correct", "faster") and run.first_correct is None:
            run.first_correct = run.attempts
        if outcome == "faster" and speedup is not None and speedup > run.best_speedup:
            run.best_speedup, incumbent, incumbent_id = speedup, candidate, kernel_id
        run.best_by_attempt.append(run.best_speedup)
        await _record(client, kernel_id, name, task_id, outcome, speedup, strategy.rationale)
    run.seconds = time.monotonic() - started
    return run


async def attempt(client: Client, task_id: str, kernel: Kernel, strategy: str, session_id: str | None,
                   parent_id: str | None, incumbent_speedup: float) -> tuple[str, str, str, float | None]:
    """compile -> test -> profile; "faster" means measurably faster than the incumbent (the lower end of the
    speedup's 95% CI above the incumbent's speedup), "correct" means passed but not better."""
    args: dict[str, Any] = {"task_id": task_id, "source": kernel.source, "strategy": strategy,
                            "flags": list(kernel.flags), "agent": "scripted"}
    if session_id:
        args["session_id"] = session_id
    if parent_id:
        args["parent_id"] = parent_id
    compiled = await call_tool(client, "compile_kernel", **args)
    kernel_id, session_id = compiled["kernel_id"], compiled["session_id"]
    if not compiled["ok"]:
        return "compile_error", kernel_id, session_id, None
    tested = await call_tool(client, "run_tests", kernel_id=kernel_id)
    if not tested["passed"]:
        return "incorrect", kernel_id, session_id, None
    # The agent compares against the baseline only; timing the numpy reference too would cost a third more.
    profile = await call_tool(client, "profile_kernel", kernel_id=kernel_id, time_reference=False)
    if profile.get("failure") == "timing_unverified":
        return "correct", kernel_id, session_id, None  # nothing measured that can be trusted
    if profile.get("failure"):
        return "incorrect", kernel_id, session_id, None  # wrong or crashing at the profiling size
    speedup = float(profile["speedup_vs_baseline"])
    low = float(profile["speedup_vs_baseline_ci95"][0])
    # A suspect result (its CI contains 1, say) never replaces the incumbent.
    faster = low > incumbent_speedup and not profile.get("suspect")
    return ("faster" if faster else "correct"), kernel_id, session_id, speedup


async def _record(client: Client, kernel_id: str, strategy: str, task_id: str, outcome: str,
                  speedup: float | None, rationale: str) -> None:
    said = {"compile_error": "did not compile", "incorrect": "gave wrong results",
            "correct": f"was correct but not measurably faster than the kernel it changed ({speedup or 0:.2f}x)",
            "faster": f"was correct and measurably faster ({speedup or 0:.2f}x vs naive)"}[outcome]
    await call_tool(client, "record_experience", kernel_id=kernel_id, strategy=strategy, rationale=rationale,
                lesson=f"{strategy} on {task_id} {said}", agent="scripted")
