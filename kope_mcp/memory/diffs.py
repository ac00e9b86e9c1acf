"""Before/after diffs of kernel sources, computed once when an attempt is recorded."""

from __future__ import annotations

import difflib

MAX_DIFF_LINES = 10


def short_diff(before: str | None, after: str | None) -> str:
    """Changed lines only (- old / + new), at most MAX_DIFF_LINES, each cut to 110 characters."""
    if not before or not after:
        return ""
    lines = [ln for ln in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
             if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and ln[1:].strip()]
    shown = [f"    {ln[0]} {ln[1:].strip()[:110]}" for ln in lines[:MAX_DIFF_LINES]]
    if len(lines) > MAX_DIFF_LINES:
        shown.append(f"    ... {len(lines) - MAX_DIFF_LINES} more changed lines")
    return "\n".join(shown)
