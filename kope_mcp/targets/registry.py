"""Which targets exist: every entry point in the ``kope_mcp.targets`` group (the built-ins register the same way
in kope-mcp's own pyproject.toml), so a third party ships a target as its own package."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from importlib.metadata import entry_points

from kope_mcp.settings import KopeSettings
from kope_mcp.targets.base import Target

ENTRY_POINT_GROUP = "kope_mcp.targets"
# Only for a source checkout that was never installed (no entry points at all): the same three built-ins.
_BUILTINS = {"c": "kope_mcp.targets.c:CpuCTarget", "triton": "kope_mcp.targets.triton:TritonTarget",
             "cuda": "kope_mcp.targets.cuda:CudaTarget"}
log = logging.getLogger(__name__)


def target_classes() -> dict[str, type[Target]]:
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    classes: dict[str, type[Target]] = {}
    if not found:
        log.warning("no %s entry points (kope-mcp is not installed?): using the built-in targets", ENTRY_POINT_GROUP)
        from importlib import import_module

        for name, ref in _BUILTINS.items():
            module, attr = ref.split(":")
            classes[name] = getattr(import_module(module), attr)
        return classes
    for name, ep in sorted(found.items()):
        try:
            cls = ep.load()
        except ImportError as exc:  # a broken third-party plug-in must not take the server down
            log.error("target %r (%s) cannot be imported: %s", name, ep.value, exc)
            continue
        if not (isinstance(cls, type) and issubclass(cls, Target)):
            log.error("target %r (%s) is not a kope_mcp.targets.base.Target subclass", name, ep.value)
            continue
        classes[name] = cls
    return classes


def load_targets(settings: KopeSettings, extra: Iterable[type[Target]] = ()) -> dict[str, Target]:
    """One instance of every registered target (plus ``extra``, e.g. a test's fake target), by name."""
    classes = {**target_classes(), **{cls.name: cls for cls in extra}}
    return {name: cls(settings) for name, cls in classes.items()}
