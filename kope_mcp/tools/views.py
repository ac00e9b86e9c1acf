"""The views (MCP Apps, extension io.modelcontextprotocol/ui): the ui:// pages, and the session resource the
session view reads. A client without Apps sees two more resources and nothing else: the tools' answers are the
same text and structured content, which is all the views read."""

from __future__ import annotations

from typing import Any

from mcp.server import MCPServer
from mcp.server.apps import Apps
from mcp.server.mcpserver.exceptions import ResourceNotFoundError

from kope_mcp.errors import KopeError
from kope_mcp.services.session_view import session_view
from kope_mcp.tools._context import LiveState
from kope_mcp.views import VIEWS, page


def ui_meta(uri: str) -> dict[str, Any]:
    """A tool's `_meta` naming its view (the flat key for hosts that read the draft's form)."""
    return {"ui": {"resourceUri": uri}, "ui/resourceUri": uri}


def apps() -> Apps:
    extension = Apps()
    for name, (uri, title, description) in VIEWS.items():
        extension.add_html_resource(uri, page(name), name=f"{name}_view", title=title, description=description,
                                    prefers_border=True)
    return extension


def register(server: MCPServer[Any], live: LiveState) -> None:
    @server.resource("kope://attempts/{kernel_id}/session", name="attempt_session",
                     title="The session of an attempt", mime_type="application/json")
    def attempt_session_resource(kernel_id: str) -> str:
        """The session an attempt belongs to, as the session view draws it: every attempt in order with its parent,
        strategy, verdict, speedup and CI (noisy and suspect marked), the best clean speedup so far, and this
        machine's roof. Reached by the attempt's id; the session's own id is not shown."""
        try:
            return session_view(live.get().workbench.memory, kernel_id).model_dump_json()
        except KopeError as exc:
            raise ResourceNotFoundError(str(exc)) from exc
