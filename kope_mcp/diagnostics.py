"""Turn gcc/clang text diagnostics into structured ones, with lines counted in the submitted source."""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(
    r"^(?P<file>[^:\n]+):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?P<sev>fatal error|error|warning|note):\s*(?P<msg>.*)$"
)
# nvcc's front end (EDG): `kernel.cu(12): error: identifier "j" is undefined`
_NVCC_LINE = re.compile(r"^(?P<file>[^(\n]+)\((?P<line>\d+)\): (?P<sev>catastrophic error|error|warning|remark)"
                        r"(?: #\S+)?: (?P<msg>.*)$")
_LINKER = re.compile(r"(undefined reference to|multiple definition of|ld returned)")


@dataclass(frozen=True)
class Diagnostic:
    line: int
    column: int
    severity: str  # error | warning | note
    message: str
    file: str = "kernel.c"


def parse_diagnostics(log: str, source_name: str) -> list[Diagnostic]:
    """Diagnostics for ``source_name`` plus those from other files (e.g. the prototype header), and linker errors.

    Messages about other files keep line 0 so a model is not pointed at a wrong line of its own source.
    """
    found: list[Diagnostic] = []
    for raw in log.splitlines():
        m = _LINE.match(raw.strip()) or _NVCC_LINE.match(raw.strip())
        if m:
            sev = m.group("sev")
            severity = "error" if sev in ("fatal error", "catastrophic error") else "note" if sev == "remark" else sev
            in_source = m.group("file").endswith(source_name)
            found.append(
                Diagnostic(
                    line=int(m.group("line")) if in_source else 0,
                    column=int(m.groupdict().get("col") or 0) if in_source else 0,
                    severity=severity,
                    message=m.group("msg").strip(),
                    file=source_name if in_source else m.group("file").rsplit("/", 1)[-1],
                )
            )
        elif _LINKER.search(raw):
            found.append(Diagnostic(line=0, column=0, severity="error", message=raw.strip(), file="<link>"))
    return found
