"""The views: self-contained HTML pages (their script and style inlined, nothing fetched) that draw what the tools
return. A client with MCP Apps shows them beside profile_kernel and query_experience (tools/views.py); the daemon
serves the same pages to a browser (`kope view`), where they read the same resources over its MCP endpoint."""

from __future__ import annotations

import functools
from importlib import resources

SESSION_URI = "ui://kope/session.html"
EXPERIENCE_URI = "ui://kope/experience.html"
# Page name -> (ui:// resource, title, what it shows)
VIEWS: dict[str, tuple[str, str, str]] = {
    "session": (SESSION_URI, "kope: the session",
                "The session of the profiled kernel: the speedup over the baseline attempt by attempt (best so far, "
                "CIs, noisy and suspect marked), the attempt tree with each edge's strategy, and the profile's "
                "figures against this machine's roof."),
    "experience": (EXPERIENCE_URI, "kope: the selected experience",
                   "What query_experience selected and why: tiers, scores, labels, provenance (measured here, "
                   "verified, claimed, imported from another home, by which agent) and the token budget used."),
}


def _asset(name: str) -> str:
    return (resources.files(__package__) / "assets" / name).read_text(encoding="utf-8")


@functools.cache
def page(name: str) -> str:
    """The view's whole HTML document."""
    if name not in VIEWS:
        raise KeyError(name)
    head = _asset("head.html").replace("{{TITLE}}", name)
    return (_asset(f"{name}.html").replace("<!--KOPE_HEAD-->", head).replace("/*KOPE_CSS*/", _asset("view.css"))
            .replace("/*KOPE_COMMON_JS*/", _asset("common.js")))
