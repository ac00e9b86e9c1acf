"""What the stdio proxy answers itself while its home's daemon starts (1.3-2 s here, longer at load), so that a
client's first calls on a new home do not wait for it:

- the tool list, from the list this package ships (`tool_list.json`, written by `tools/write_tool_list.py` from
  the server itself and checked against it by a test), used only while its key matches this code;
- `list_tasks` and `get_task`, from this machine's task folders and backends (services/catalogue.py), where no
  cluster is configured (its devices are the daemon's to know);
- `query_experience` without a session, on a home that had no memory when the proxy started (no database file)
  and for the first seconds only: the selection over an empty memory (memory/empty.py). Nothing can have been
  recorded meanwhile, as no daemon accepted a call (the daemon this proxy starts creates the database, empty,
  while it starts; a server started elsewhere that takes the home could record in those seconds).

Everything else, and anything out of the ordinary in these (an argument of the wrong type, an unknown task, an
extra argument), waits for the daemon, which words its refusals itself. Each early answer is the one the daemon
gives for the same call in the same circumstances: tests compare them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
import time
import typing
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mcp.types as types

import kope_mcp
from kope_mcp.errors import KopeError
from kope_mcp.settings import KopeSettings

if TYPE_CHECKING:
    from pydantic import BaseModel

    from kope_mcp.experience.service import ExperienceService
    from kope_mcp.services.catalogue import LocalCatalogue

log = logging.getLogger(__name__)
SHIPPED_TOOLS = Path(__file__).with_name("tool_list.json")
NEW_HOME_WINDOW_S = 30.0  # how long after the proxy started a home without a memory is taken to have none


@functools.cache
def tools_key() -> str:
    """What the tool list depends on: this package's tool, model and instruction sources, and the versions of the
    SDK and pydantic that turn them into schemas."""
    root = Path(kope_mcp.__file__).parent
    digest = hashlib.sha256(kope_mcp.__version__.encode())
    for name in ("mcp", "pydantic"):
        digest.update(f"{name} {metadata.version(name)}\n".encode())
    for path in sorted([*root.glob("tools/*.py"), root / "models.py", root / "app" / "instructions.py"]):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def shipped_tools() -> types.ListToolsResult | None:
    """The shipped tool list, if it was written from this very code."""
    try:
        shipped = json.loads(SHIPPED_TOOLS.read_text(encoding="utf-8"))
        if shipped.get("key") != tools_key():
            return None  # a tool was edited since: the daemon's list, or the home's copy of it, is the truth
        return types.ListToolsResult.model_validate(shipped["result"])
    except (OSError, ValueError, KeyError, AttributeError):
        return None


def shipped_text(tools: types.ListToolsResult) -> str:
    """The shipped file's content for ``tools`` (tools/write_tool_list.py)."""
    result = tools.model_dump(mode="json", by_alias=True, exclude_none=True)
    return json.dumps({"key": tools_key(), "result": result}, indent=1, sort_keys=True) + "\n"


# An argument the early answer takes: a check of the client's JSON value. Anything else is the daemon's to refuse.
Check = Callable[[Any], bool]


def _text(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _whole(low: int, high: int) -> Check:
    return lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and low <= v <= high)


def _one_of(*values: str) -> Check:
    return lambda v: v is None or v in values


def _phases() -> tuple[str, ...]:
    from kope_mcp.models import Phase

    return typing.get_args(Phase)


ARGUMENTS: dict[str, tuple[dict[str, Check], frozenset[str]]] = {
    "list_tasks": ({"family": _text, "level": _whole(1, 4)}, frozenset()),
    "get_task": ({"task_id": _text}, frozenset({"task_id"})),
    "query_experience": ({"query": _text, "task_id": _text, "phase": lambda v: v is None or v in _phases(),
                          "hardware": _text, "token_budget": _whole(1, 100_000), "agent": _text,
                          "agent_mode": _one_of("prefer", "only"), "backend": _text,
                          "session_id": lambda v: v is None},  # a session lives in a memory: the daemon's
                         frozenset({"query"})),
}


def _fits(tool: str, arguments: dict[str, Any]) -> bool:
    checks, required = ARGUMENTS[tool]
    return (all(name in checks and checks[name](value) for name, value in arguments.items())
            and all(arguments.get(name) is not None for name in required))


def as_result(model: BaseModel) -> types.CallToolResult:
    """A tool's return value as the SDK's MCPServer puts it on the wire (its func_metadata.convert_result)."""
    import pydantic_core

    text = pydantic_core.to_json(model, fallback=str, indent=2).decode()
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=model.model_dump(mode="json", by_alias=True))


class EarlyAnswers:
    """The proxy's own answers for one home (built on first use, kept: the task folders are watched by the
    registry, the backends' status is read per call as the daemon does)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        # Read before this proxy starts a daemon (which creates the database while it starts).
        self._new_until = (time.monotonic() + NEW_HOME_WINDOW_S
                           if not self._settings().memory_path.exists() else 0.0)
        self._lock = threading.Lock()
        self._catalogue: LocalCatalogue | None = None
        self._experience: ExperienceService | None = None

    def answer(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult | None:
        """The daemon's answer to this call, or None where only the daemon can give it."""
        if tool not in ARGUMENTS or not _fits(tool, arguments):
            return None
        settings = self._settings()
        if settings.cluster:
            return None
        from kope_mcp.services.catalogue import describe_task, list_tasks

        try:
            with self._lock:
                if tool == "list_tasks":
                    return as_result(list_tasks(self._local(settings), **arguments))
                if tool == "get_task":
                    return as_result(describe_task(self._local(settings), arguments["task_id"]))
                if time.monotonic() >= self._new_until:
                    return None  # a memory to select from: the daemon's
                return as_result(self._service(settings).query_experience(**arguments))
        except KopeError:
            return None  # the daemon words the refusal (an unknown task, family or backend)
        except Exception as exc:  # whatever went wrong here, the daemon answers the call
            log.warning("answering %s without the daemon failed (%r): the daemon answers it", tool, exc)
            return None

    def warm(self) -> None:
        """Build what the answers need (task specs, backends, the tokenizer) before the first call asks."""
        settings = self._settings()
        if settings.cluster:
            return
        from kope_mcp.experience.tokens import token_counter

        with self._lock:  # the first call waits for this rather than build it all a second time beside it
            try:
                self._service(settings)
                token_counter()
            except Exception as exc:  # only a head start: the call that needs it reports what is wrong
                log.debug("early answers not prepared: %r", exc)

    def _settings(self) -> KopeSettings:
        return KopeSettings.from_env().model_copy(update={"home": self.home})

    def _local(self, settings: KopeSettings) -> LocalCatalogue:
        if self._catalogue is None:
            from kope_mcp.services.catalogue import LocalCatalogue

            self._catalogue = LocalCatalogue.of(settings)
        return self._catalogue

    def _service(self, settings: KopeSettings) -> ExperienceService:
        if self._experience is None:
            from kope_mcp.experience.config import load_selection
            from kope_mcp.experience.service import ExperienceService
            from kope_mcp.memory.empty import EmptyMemory
            from kope_mcp.memory.experience_memory import ExperienceMemory

            local = self._local(settings)
            # EmptyMemory has every read the selection makes (tests hold it to a new ExperienceMemory's answers).
            memory = typing.cast(ExperienceMemory, EmptyMemory(settings.embeddings))
            self._experience = ExperienceService(memory, local.tasks, local.target_hardware_key,
                                                 load_selection(settings.selection))
        return self._experience
