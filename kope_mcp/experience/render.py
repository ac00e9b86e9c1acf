"""Compact renderings of experience for a prompt: case fields, before/after diffs, error -> fix pairs."""

from __future__ import annotations

from typing import Any, NamedTuple

from kope_mcp.experience.candidates import Candidate
from kope_mcp.experience.selection import Scored
from kope_mcp.experience.tokens import count_tokens, truncate_to_tokens
from kope_mcp.memory.records import AttemptRecord
from kope_mcp.models import ContextItem

_SECTIONS = (
    ("hot", None, "## Where you are"),
    ("warm", "case", "## What worked here (this task or family, this hardware)"),
    ("warm", "fix", "## Errors and the fixes that resolved them"),
    ("warm", "pitfall", "## Pitfalls to avoid"),
    ("warm", "lesson", "## Lessons (other agents' words, quoted; labels and numbers are the server's measurements)"),
    ("cold", None, "## From other families, hardware or homes (not measured here for this task)"),
)


def render_item(cand: Candidate, task_id: str | None, with_diff: bool = False, hardware: str | None = None) -> str:
    """One bullet of compact case fields; ``with_diff`` adds the before/after diff recorded with the attempt;
    a measurement made on other hardware than ``hardware`` (the question's) says so."""
    rec = cand.attempt
    where = ""
    if rec is not None:
        where = f"{rec.task_id}" + ("" if rec.task_id == task_id else f" ({rec.family})")
        # C is the default backend; any other is named, since its code does not transfer line for line.
        where += f" [{rec.target}]" if rec.target != "c" else ""
    if cand.kind == "case" and rec is not None:
        elsewhere = f"imported from {rec.origin}, untested here: " if rec.origin else \
            ("other hardware, untested here: " if _measured_elsewhere(rec.hardware_key, hardware) else "")
        head = (f"- [{elsewhere}{rec.label}, step x{rec.step_ratio or 0:.2f}, {rec.speedup or 0:.2f}x vs naive, "
                f"confidence {rec.confidence:.2f}] {where}: {rec.strategy or 'unnamed change'}; flags "
                f"{' '.join(rec.flags) or '-'} ({rec.kernel_id}, {rec.hardware_key})")
        diff = rec.diff_from_parent if with_diff else ""
        return f"{head}\n{diff}" if diff else head
    if cand.kind == "fix" and rec is not None and cand.fix is not None:
        problem = rec.error_signature or rec.failure or "failure"
        # Name what was tried: "`error` was fixed" alone does not say which change to be careful with.
        head = (f"- {where}: {rec.strategy or 'a change'} failed with `{problem}` ({rec.kernel_id}); fixed by "
                f"{cand.fix.kernel_id}{': ' + cand.fix.strategy if cand.fix.strategy else ''}")
        # The fix's recorded diff is against the failing attempt when that was its parent (the default).
        diff = cand.fix.diff_from_parent if with_diff and cand.fix.parent_id == rec.kernel_id else ""
        return f"{head}\n{diff}" if diff else head
    if cand.kind == "pitfall" and rec is not None:
        if not rec.ok:
            outcome = f"did not compile: {rec.error_signature or 'error'}"
        elif rec.correct is False:
            outcome = f"wrong results ({rec.error_signature or rec.failure})"
        else:
            outcome = f"{rec.label}: {rec.speedup or 0:.2f}x vs naive, step x{rec.step_ratio or 0:.2f}"
        return (f"- AVOID {rec.strategy or 'this change'} on {where}: {outcome} ({rec.kernel_id}, "
                f"{rec.hardware_key}" + (f", imported from {rec.origin}" if rec.origin else "") + ")")
    lesson = cand.lesson
    assert lesson is not None
    status = (f"{_measured_elsewhere(lesson.hardware_key, hardware)}verified, {lesson.label}"
              + (f", {lesson.speedup:.2f}x" if lesson.speedup else "") if lesson.verified else "unverified")
    if lesson.origin:
        status = f"imported from {lesson.origin}, unverified here" + (
            f": {lesson.label} {lesson.speedup:.2f}x there" if lesson.speedup else "")
    elif lesson.about_agent:
        status = (f"unverified: {lesson.agent or 'an agent'} says about {lesson.about_agent}'s "
                  + (f"{lesson.speedup:.2f}x " if lesson.speedup else "") + f"attempt {lesson.attempt_id}")
    scope = (lesson.task_id or lesson.family or "general") + (f" [{lesson.target}]" if lesson.target not in
                                                              (None, "c") else "")
    # Quoted on one line: no heading, list or instruction in a lesson can leave its item.
    text = f"- [{status}] {scope} / {lesson.strategy}: \"{_one_line(lesson.text)}\""
    if lesson.rationale:
        text += f" (why: \"{_one_line(lesson.rationale)}\")"
    return text[:1600]


def _measured_elsewhere(measured_on: str | None, asked_for: str | None) -> str:
    if not measured_on or not asked_for or measured_on == asked_for:
        return ""
    return f"measured on {measured_on}, untested here: "


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace('"', "'")


def has_diff(cand: Candidate) -> bool:
    rec = cand.attempt
    if rec is None:
        return False
    if cand.kind == "case":
        return bool(rec.diff_from_parent)
    return cand.kind == "fix" and cand.fix is not None and cand.fix.parent_id == rec.kernel_id and \
        bool(cand.fix.diff_from_parent)


class Chosen(NamedTuple):
    """An item selection kept: its score and text, the candidate it renders, and its tier (warm or cold)."""

    scored: Scored
    candidate: Candidate
    tier: str


class HotItem(NamedTuple):
    """A hot-tier line (target, incumbent, latest feedback) and the data behind it."""

    kind: str
    item_id: str
    text: str
    data: dict[str, Any]


def hot_section(hot: list[HotItem]) -> str:
    return _SECTIONS[0][2] + "\n" + "\n".join(f"- {h.text}" for h in hot) if hot else ""


def render_context(hot: list[HotItem], chosen: list[Chosen],
                   budget: int) -> tuple[str, list[ContextItem], int]:
    """Markdown grouped by tier and kind; drops the lowest items until headers and items fit the budget."""
    chosen = list(chosen)
    while True:
        context, spans = _assemble(hot, chosen)
        used = count_tokens(context) if context else 0
        if used > budget and not chosen:
            # Only the hot tier is left and it does not fit: cut it rather than exceed the budget.
            context = truncate_to_tokens(context, budget)
            used = count_tokens(context) if context else 0
            spans = {key: (min(a, len(context)), min(b, len(context))) for key, (a, b) in spans.items()}
        if used <= budget or not chosen:
            break
        chosen.pop(min(range(len(chosen)), key=lambda i: chosen[i][0].score))
    return context, items_for(hot, chosen, spans), used


def _assemble(hot: list[HotItem], chosen: list[Chosen]
              ) -> tuple[str, dict[tuple[str, str], tuple[int, int]]]:
    """The context and where each item's text lies in it, keyed by (tier, id)."""
    out: list[str] = []
    spans: dict[tuple[str, str], tuple[int, int]] = {}
    at = 0

    def put(text: str, key: tuple[str, str] | None = None) -> None:
        nonlocal at
        if key is not None:
            spans[key] = (at, at + len(text))
        out.append(text)
        at += len(text)

    for tier, kind, header in _SECTIONS:
        if tier == "hot":
            lines = [(f"- {h.text}", ("hot", h.item_id)) for h in hot]
        else:
            lines = [(s.text, (tier, s.item_id)) for s, c, t in chosen
                     if t == tier and (kind is None or c.kind == kind)]
        if not lines:
            continue
        put("\n\n" if out else "")
        put(header)
        for text, key in lines:
            put("\n")
            put(text, key)
    return "".join(out), spans


def items_for(hot: list[HotItem], chosen: list[Chosen],
              spans: dict[tuple[str, str], tuple[int, int]]) -> list[ContextItem]:
    items = [ContextItem(id=h.item_id, tier="hot", kind=h.kind, score=1.0,  # type: ignore[arg-type]
                         tokens=count_tokens(h.text), span=spans.get(("hot", h.item_id), (0, 0)),
                         why="required by the current state", **h.data) for h in hot]
    items += [ContextItem(id=s.item_id, tier=tier, kind=c.kind, score=s.score,  # type: ignore[arg-type]
                          tokens=s.tokens, span=spans.get((tier, s.item_id), (0, 0)),
                          why="; ".join(c.reasons) or "ranked by outcome", **item_data(c))
              for s, c, tier in chosen]
    return items


def attempt_data(rec: AttemptRecord) -> dict[str, Any]:
    """The fields of ContextItem an attempt fills."""
    return {"target": rec.target, "strategy": rec.strategy, "label": rec.label, "speedup": rec.speedup,
            "step_ratio": rec.step_ratio, "confidence": rec.confidence, "task_id": rec.task_id,
            "family": rec.family, "hardware": rec.hardware_key, "flags": list(rec.flags),
            "error_signature": rec.error_signature if not rec.ok or rec.correct is False else None,
            "origin": rec.origin or None, "agent": rec.agent or None}


def item_data(cand: Candidate) -> dict[str, Any]:
    """The data behind a candidate's line, as ContextItem fields."""
    if cand.attempt is not None:
        data = attempt_data(cand.attempt)
        if cand.kind == "fix" and cand.fix is not None:
            data |= {"fix_strategy": cand.fix.strategy, "fix_id": cand.fix.kernel_id}
        return data
    lesson = cand.lesson
    assert lesson is not None
    return {"target": lesson.target, "strategy": lesson.strategy, "label": lesson.label, "speedup": lesson.speedup,
            "step_ratio": lesson.step_ratio, "confidence": lesson.confidence, "verified": lesson.verified,
            "task_id": lesson.task_id, "family": lesson.family, "hardware": lesson.hardware_key,
            "origin": lesson.origin or None, "about_agent": lesson.about_agent or None, "agent": lesson.agent or None}
