"""Compact renderings of experience for a prompt: case fields, before/after diffs, error -> fix pairs."""

from __future__ import annotations

from kope_mcp.memory.selection import Scored, estimate_tokens, truncate_to_tokens
from kope_mcp.models import ContextItem
from kope_mcp.services.candidates import Candidate

_SECTIONS = (
    ("hot", None, "## Where you are"),
    ("warm", "case", "## What worked here (this task or family, this hardware)"),
    ("warm", "fix", "## Errors and the fixes that resolved them"),
    ("warm", "pitfall", "## Pitfalls to avoid"),
    ("warm", "lesson", "## Lessons"),
    ("cold", None, "## From other families or hardware"),
)


def render_item(cand: Candidate, task_id: str | None, with_diff: bool = False) -> str:
    """One bullet of compact case fields; ``with_diff`` adds the before/after diff recorded with the attempt."""
    rec = cand.attempt
    where = ""
    if rec is not None:
        where = f"{rec.task_id}" + ("" if rec.task_id == task_id else f" ({rec.family})")
        # C is the default backend; any other is named, since its code does not transfer line for line.
        where += f" [{rec.target}]" if rec.target != "c" else ""
    if cand.kind == "case" and rec is not None:
        head = (f"- [{rec.label}, step x{rec.step_ratio or 0:.2f}, {rec.speedup or 0:.2f}x vs naive, "
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
                f"{rec.hardware_key})")
    lesson = cand.lesson
    assert lesson is not None
    status = (f"verified, {lesson.label}" + (f", {lesson.speedup:.2f}x" if lesson.speedup else "")
              if lesson.verified else "unverified")
    scope = (lesson.task_id or lesson.family or "general") + (f" [{lesson.target}]" if lesson.target not in
                                                              (None, "c") else "")
    text = f"- [{status}] {scope} / {lesson.strategy}: {lesson.text}"
    if lesson.rationale:
        text += f" (why: {lesson.rationale})"
    return text[:1600]


def has_diff(cand: Candidate) -> bool:
    rec = cand.attempt
    if rec is None:
        return False
    if cand.kind == "case":
        return bool(rec.diff_from_parent)
    return cand.kind == "fix" and cand.fix is not None and cand.fix.parent_id == rec.kernel_id and \
        bool(cand.fix.diff_from_parent)


def hot_section(hot: list[tuple[str, str, str]]) -> str:
    return _SECTIONS[0][2] + "\n" + "\n".join(f"- {text}" for _, _, text in hot) if hot else ""


def render_context(hot: list[tuple[str, str, str]], chosen: list[tuple[Scored, Candidate, str]],
                   budget: int) -> tuple[str, list[ContextItem], int]:
    """Markdown grouped by tier and kind; drops the lowest items until headers and items fit the budget."""
    chosen = list(chosen)
    while True:
        parts: list[str] = []
        for tier, kind, header in _SECTIONS:
            if tier == "hot":
                if hot:
                    parts.append(hot_section(hot))
                continue
            else:
                lines = [s.text for s, c, t in chosen if t == tier and (kind is None or c.kind == kind)]
            if lines:
                parts.append(header + "\n" + "\n".join(lines))
        context = "\n\n".join(parts)
        used = estimate_tokens(context) if context else 0
        if used > budget and not chosen:
            # Only the hot tier is left and it does not fit: cut it rather than exceed the budget.
            context = truncate_to_tokens(context, budget)
            used = estimate_tokens(context) if context else 0
        if used <= budget or not chosen:
            break
        chosen.pop(min(range(len(chosen)), key=lambda i: chosen[i][0].score))
    return context, items_for(hot, chosen), used


def items_for(hot: list[tuple[str, str, str]], chosen: list[tuple[Scored, Candidate, str]]) -> list[ContextItem]:
    items = [ContextItem(id=i, tier="hot", kind=k, score=1.0, tokens=estimate_tokens(t),  # type: ignore[arg-type]
                         why="required by the current state") for k, i, t in hot]
    items += [ContextItem(id=s.item_id, tier=tier, kind=c.kind, score=s.score,  # type: ignore[arg-type]
                          tokens=s.tokens, target=_target_of(c), why="; ".join(c.reasons) or "ranked by outcome")
              for s, c, tier in chosen]
    return items


def _target_of(cand: Candidate) -> str | None:
    if cand.attempt is not None:
        return cand.attempt.target
    return cand.lesson.target if cand.lesson is not None else None
