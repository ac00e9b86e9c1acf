"""A scripted agent that works the KOPE loop through the MCP tools only: query -> choose -> compile -> test ->
profile -> record, keeping the incumbent only when a correct candidate is measurably faster.

Arms differ only in what the agent reads before choosing:
- ``none``: nothing; a seeded random order of strategies;
- ``static``: the warm-up's global strategy order (every measured outcome pooled, no task or family), read once;
- ``oracle``: the task's own best order, from the measured catalogue (catalogue.py): the ceiling;
- ``passive@W``: the whole memory (resource kope://memory/history.json) every iteration, as an agent that pastes
  its entire history into its own context;
- ``active@W``: query_experience with a token budget (active context selection);
- ``aa@W``: the A/A control: passive's reads through the same window, static's choices (tie-breaks are seeded
  by task for every arm), so it must tie ``static``: a difference is bias of the protocol between arms;
- ``shuffled@W``: the sensitivity arm of passive: the same history with its lines in a seeded random order, so
  what the window's truncation keeps no longer depends on when things happened.
The agent keeps a chat transcript bounded to W tokens (transcript.py: its task, what it read, the kernels it
wrote and the tools' answers) and acts only on the memory items still inside it, reading their data fields
(strategy, label, step ratio, task, family, hardware), never the markdown. ``passive`` and ``active`` are read
by the same code, so the difference is what the memory hands them and what fits in the window.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from mcp import Client

from kope_mcp.bench.candidates import BY_NAME, CHOICES, Kernel
from kope_mcp.bench.measure import SharedMeasure, measurably_faster
from kope_mcp.bench.tool_calls import call_tool
from kope_mcp.bench.transcript import WINDOWS, Transcript

ACTIVE_BUDGET = 2000
WIN_LABELS = ("effective", "partial")
BROKEN_LABELS = ("compile_error", "incorrect")


def arms(windows: tuple[int, ...] = WINDOWS) -> tuple[str, ...]:
    """The bench's arms: the controls, the A/A control at the widest window, then each memory policy at each
    pre-registered window."""
    return ("none", "static", "oracle", f"aa@{max(windows) // 1000}k", f"shuffled@{min(windows) // 1000}k",
            *(f"{p}@{w // 1000}k" for w in windows for p in ("passive", "active")))


def parse_arm(arm: str) -> tuple[str, int | None]:
    """'active@32k' -> ('active', 32000); controls have no window."""
    policy, _, window = arm.partition("@")
    return policy, int(window.removesuffix("k")) * 1000 if window else None


SYSTEM = ("You optimise a C kernel with the kope-mcp tools: choose a strategy from what you remember, compile, "
          "test, profile, keep the fastest correct kernel, and record what you learned.")


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
    context_tokens: int = 0  # real tokens read from the memory (before the window cut them)
    peak_tokens: int = 0  # the transcript's largest size
    dropped_tokens: int = 0  # what the window lost
    items_seen: list[int] = field(default_factory=list)  # memory items inside the window at each choice
    load: list[float] = field(default_factory=list)  # the 1-minute load average at each attempt
    hardware: str | None = None
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    strategies: list[str] = field(default_factory=list)
    # [attempt, source, flags] each time the incumbent changed (attempt 0: the naive kernel every run starts from)
    kept: list[list[Any]] = field(default_factory=list)
    verdicts: dict[str, int] = field(default_factory=dict)  # suspect, noisy and timing_unverified profiles
    # The incumbent's speedup after each attempt by the figures of the whole run: the shared figure every arm
    # decided on (measure.py), or the judge's re-profiles (judge.py) where there is none: what metrics read
    judged: list[float] = field(default_factory=list)
    # [attempt, kernel key, figure, its interval's low end, kept] for every candidate decided on a shared figure
    # (measure.py): the report checks that no two arms decided one kernel on different figures
    decisions: list[list[Any]] = field(default_factory=list)
    error: str = ""  # why this run stopped short (a tool failed): not a result; `--resume` runs it again
    # A model's episode (llm_episode.py); the scripted agent leaves them at 0
    tool_calls: int = 0
    tool_errors: int = 0
    model_calls: int = 0
    prompt_tokens: int = 0  # as the endpoint's `usage` counted them (tool schemas included)
    completion_tokens: int = 0
    trimmed_retries: int = 0
    stopped: str = ""  # finish, budget, iterations or context limit (a model's episode)

    @property
    def solved(self) -> bool:
        return self.first_correct is not None

    @property
    def curve(self) -> list[float]:
        """The incumbent's speedup after each attempt: re-profiled by the judge when it ran (every arm's kernels
        in one interleaved pass), else as the agent measured it in its own run."""
        return self.judged or self.best_by_attempt

    @property
    def final(self) -> float:
        return self.curve[-1] if self.curve else 1.0


def evidence(items: list[dict[str, Any]], family: str, task_id: str, hardware: str | None = None,
             local_only: bool = True) -> dict[str, float]:
    """A score per strategy from memory items: measured steps (log of the step ratio, weighted by confidence)
    minus failures. What a reader weighs by itself is only what any reader would: evidence about this task or
    family counts fully, elsewhere a quarter (``local_only=False``: everything counts fully), and other hardware
    half. Unknown strategies are absent (score 0)."""
    scores: dict[str, float] = {}
    for item in items:
        name = (item.get("strategy") or "").strip().lower()
        if not name or item.get("kind") in ("target", "incumbent", "feedback"):
            continue
        local = item.get("task_id") == task_id or item.get("family") == family or not local_only
        weight = (1.0 if local else 0.25) * (0.5 if hardware and item.get("hardware") not in (None, hardware)
                                            else 1.0)
        label, step = item.get("label"), item.get("step_ratio")
        if item.get("kind") == "fix":
            # It broke, though it could be repaired: an attempt lost, and the repair may still not pay off.
            scores[name] = scores.get(name, 0.0) - 0.5 * weight
        elif label in BROKEN_LABELS:
            scores[name] = scores.get(name, 0.0) - 1.0 * weight
        elif step is not None and label not in ("unmeasured", "lesson"):
            gain = math.log(max(float(step), 1e-3)) * float(item.get("confidence") or 0.5)
            scores[name] = scores.get(name, 0.0) + weight * (gain if label in WIN_LABELS or gain < 0 else 0.0) \
                - (0.3 * weight if label == "negative" else 0.0)
    return scores


def order(policy: str, items: list[dict[str, Any]] | None, family: str, task_id: str, rng: random.Random,
          tried: set[str], hardware: str | None = None, ranking: list[str] | None = None) -> list[str]:
    """Strategies to try next, best first."""
    untried = [s for s in CHOICES if s not in tried]
    rng.shuffle(untried)  # the seeded tie-break (and the whole order for `none`)
    if policy in ("static", "oracle", "aa") and ranking is not None:
        rank = {name.lower(): i for i, name in enumerate(ranking)}
        return sorted(untried, key=lambda s: rank.get(s.lower(), len(rank)))
    if policy == "none" or not items:
        return untried
    scores = evidence(items, family, task_id, hardware)
    return sorted(untried, key=lambda s: -scores.get(s.lower(), 0.0))


def static_order(history: dict[str, Any]) -> list[str]:
    """The warm-up's global strategy order: every measured outcome pooled, whatever its task (best first)."""
    scores = evidence(history["items"], family="", task_id="", local_only=False)
    return sorted(scores, key=lambda name: -scores[name])


async def read_history(client: Client) -> dict[str, Any]:
    """The whole memory as data (resource kope://memory/history.json)."""
    raw = "".join(getattr(c, "text", "") for c in (await client.read_resource("kope://memory/history.json")).contents)
    history: dict[str, Any] = json.loads(raw)
    return history


def shuffled_history(history: dict[str, Any], rng: random.Random) -> tuple[str, list[dict[str, Any]]]:
    """The history's lines in a random order, each item's span moved with its line."""
    context: str = history["context"]
    items = list(history["items"])
    rng.shuffle(items)
    text = context.split("\n", 1)[0] + " (shuffled)"
    moved = []
    for item in items:
        line = context[item["span"][0]:item["span"][1]]
        text += "\n"
        moved.append({**item, "span": (len(text), len(text) + len(line))})
        text += line
    return text + "\n", moved


async def _read_memory(client: Client, policy: str, task_id: str, session_id: str | None,
                       transcript: Transcript, rng: random.Random | None = None) -> None:
    """Put what the policy reads into the transcript (with its items); the window does the rest."""
    if policy in ("passive", "shuffled"):
        history = await read_history(client)
        if policy == "shuffled":
            text, items = shuffled_history(history, rng or random.Random(0))
            transcript.add("user", text, items=items)
            return
        transcript.add("user", history["context"], items=[i for i in history["items"]])
        return
    args: dict[str, Any] = {"query": f"what makes {task_id} faster and what breaks it", "task_id": task_id,
                            "token_budget": ACTIVE_BUDGET}
    if session_id:
        args["session_id"] = session_id
    answer = await call_tool(client, "query_experience", **args)
    transcript.add("user", str(answer["context"]), items=list(answer["items"]))


async def run_task(client: Client, task_id: str, arm: str, budget: int, seed: int,
                   ranking: list[str] | None = None, measure: SharedMeasure | None = None) -> TaskRun:
    """Work one task with `budget` attempts; every outcome goes through (and into) the server's memory. With
    `measure`, a candidate is kept or not on its shared figure (measure.py), whatever its own profile said."""
    started = time.monotonic()
    policy, window = parse_arm(arm)
    task = await call_tool(client, "get_task", task_id=task_id)
    run = TaskRun(task_id=task_id, family=task["family"], policy=arm, seed=seed, budget=budget)
    # Ties are broken by task and seed, the same for every arm: a tie-break seeded by arm is noise that has
    # nothing to do with what the arm read (and the A/A arm makes static's choices exactly).
    rng = random.Random(f"{seed}/{task_id}")
    transcript = Transcript(window)
    transcript.add("system", SYSTEM, pinned=True)
    transcript.add("user", f"Task {task_id} ({task['family']}): {task.get('description', '')}\n"
                   f"{task.get('baseline_source') or ''}", pinned=True)
    if policy in ("static", "oracle", "aa") and ranking is not None:
        # Read once: the order itself is what the agent keeps.
        where = "during the warm-up: " if policy in ("static", "aa") else "on this task: "
        transcript.add("user", "Strategies in the order that paid off most " + where + "; ".join(ranking))
        run.context_tokens += transcript.messages[-1].tokens
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
        run.kept.append([0, incumbent.source, list(incumbent.flags)])
    tried: set[str] = set()
    pending: tuple[str, Kernel, str] | None = None  # a fix to apply to the candidate that failed, and its id
    while run.attempts < budget:
        parent_id = incumbent_id
        if pending is not None:
            (name, base, parent_id), pending = pending, None
        else:
            items: list[dict[str, Any]] | None = None
            if policy in ("passive", "active", "aa", "shuffled"):
                before = transcript.tokens + transcript.dropped_tokens
                await _read_memory(client, "passive" if policy == "aa" else policy, task_id, session_id, transcript,
                                   random.Random(f"{seed}/shuffle/{task_id}/{run.attempts}"))
                run.context_tokens += transcript.tokens + transcript.dropped_tokens - before
                items = transcript.visible_items()
                run.items_seen.append(len(items))
            name = next((s for s in order(policy, items, run.family, task_id, rng, tried, run.hardware, ranking)
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
        run.load.append(round(os.getloadavg()[0], 2))
        outcome, kernel_id, session_id, speedup = await attempt(client, task_id, candidate, name, session_id,
                                                                  parent_id, run.best_speedup, transcript,
                                                                  run.verdicts, measure)
        figure = measure.known(task_id, candidate.source, candidate.flags) if measure is not None else None
        # Decided on the shared figure: it passed here and was measured (a shared failure reads as incorrect).
        if measure is not None and figure is not None and (outcome in ("faster", "correct") or figure.speedup is None):
            run.decisions.append([run.attempts, measure.key(task_id, candidate.source, candidate.flags),
                                  figure.speedup, figure.low, outcome == "faster"])
        if run.hardware is None:
            run.hardware = transcript.hardware
        run.outcomes[outcome] = run.outcomes.get(outcome, 0) + 1
        if outcome == "compile_error" and strategy.fix:
            pending = (strategy.fix, candidate, kernel_id)
        if outcome in ("correct", "faster") and run.first_correct is None:
            run.first_correct = run.attempts
        if outcome == "faster" and speedup is not None and speedup > run.best_speedup:
            run.best_speedup, incumbent, incumbent_id = speedup, candidate, kernel_id
            run.kept.append([run.attempts, candidate.source, list(candidate.flags)])
        run.best_by_attempt.append(run.best_speedup)
        await _record(client, kernel_id, session_id, name, task_id, outcome, speedup, strategy.rationale)
    run.seconds = time.monotonic() - started
    run.peak_tokens, run.dropped_tokens = transcript.peak_tokens, transcript.dropped_tokens
    return run


async def attempt(client: Client, task_id: str, kernel: Kernel, strategy: str, session_id: str | None,
                   parent_id: str | None, incumbent_speedup: float, transcript: Transcript | None = None,
                   verdicts: dict[str, int] | None = None,
                   measure: SharedMeasure | None = None) -> tuple[str, str, str, float | None]:
    """compile -> test -> profile; "faster" means measurably faster than the incumbent (the lower end of the
    speedup's 95% CI above the incumbent's speedup), "correct" means passed but not better. With `measure` the
    decision and the speedup are the kernel's shared figure's; the arm's own profile only goes into its
    memory."""
    args: dict[str, Any] = {"task_id": task_id, "source": kernel.source, "strategy": strategy,
                            "flags": list(kernel.flags), "agent": "scripted"}
    if session_id:
        args["session_id"] = session_id
    if parent_id:
        args["parent_id"] = parent_id
    def said(result: dict[str, Any]) -> dict[str, Any]:
        if transcript is not None:  # what a model would have in its chat: its kernel and the tools' answers
            transcript.add("tool", json.dumps(result))
        return result

    if transcript is not None:
        transcript.add("assistant", f"{strategy}, flags {' '.join(kernel.flags)}:\n{kernel.source}")
    compiled = said(await call_tool(client, "compile_kernel", **args))
    kernel_id, session_id = compiled["kernel_id"], compiled["session_id"]
    if not compiled["ok"]:
        return "compile_error", kernel_id, session_id, None
    tested = said(await call_tool(client, "run_tests", kernel_id=kernel_id))
    if not tested["passed"]:
        return "incorrect", kernel_id, session_id, None
    # The agent compares against the baseline only; timing the numpy reference too would cost a third more.
    profile = said(await call_tool(client, "profile_kernel", kernel_id=kernel_id, time_reference=False))
    if transcript is not None:
        transcript.hardware = (profile.get("hardware") or {}).get("key")
    if verdicts is not None:
        for flag in ("suspect", "noisy"):
            if profile.get(flag):
                verdicts[flag] = verdicts.get(flag, 0) + 1
        if profile.get("failure") == "timing_unverified":
            verdicts["timing_unverified"] = verdicts.get("timing_unverified", 0) + 1
    if measure is not None:
        figure = await measure.figure(task_id, kernel.source, kernel.flags)
        if figure.speedup is None:
            return ("correct" if figure.failure == "timing_unverified" else "incorrect"), kernel_id, session_id, None
        kept = measurably_faster(figure, incumbent_speedup)
        return ("faster" if kept else "correct"), kernel_id, session_id, figure.speedup
    if profile.get("failure") == "timing_unverified":
        return "correct", kernel_id, session_id, None  # nothing measured that can be trusted
    if profile.get("failure"):
        return "incorrect", kernel_id, session_id, None  # wrong or crashing at the profiling size
    speedup = float(profile["speedup_vs_baseline"])
    low = float(profile["speedup_vs_baseline_ci95"][0])
    # A suspect result (its CI contains 1, say) never replaces the incumbent.
    faster = low > incumbent_speedup and not profile.get("suspect")
    return ("faster" if faster else "correct"), kernel_id, session_id, speedup


async def _record(client: Client, kernel_id: str, session_id: str | None, strategy: str, task_id: str,
                  outcome: str, speedup: float | None, rationale: str) -> None:
    said = {"compile_error": "did not compile", "incorrect": "gave wrong results",
            "correct": f"was correct but not measurably faster than the kernel it changed ({speedup or 0:.2f}x)",
            "faster": f"was correct and measurably faster ({speedup or 0:.2f}x vs naive)"}[outcome]
    await call_tool(client, "record_experience", kernel_id=kernel_id, session_id=session_id, strategy=strategy,
                    rationale=rationale, lesson=f"{strategy} on {task_id} {said}", agent="scripted")
