"""Loop-nest rewrites of C kernels for the scripted agent: multiple accumulators, loop interchange, blocking.

They recognise the canonical loops the suite's kernels are written in, ``for (int64_t v = A; v < B; v++)`` with
a braced or single-statement body, and rewrite them as text. A nest they do not recognise is left alone (the
rewrite returns None: it does not apply to that kernel), so where a rewrite applies is decided by the kernel's
shape, which is what makes the catalogue differ by family: interchange fits matmul and column sums, blocking
fits perfect 2-deep nests (transpose, matmul, conv outputs), multiple accumulators fit every `acc += ...` loop.

Interchange and blocking keep each output's summation order, so results are bit-identical; multiple
accumulators reassociate the sum (within every accumulation tolerance of the suite).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

_HEADER = re.compile(r"for\s*\(\s*int64_t\s+(?P<var>\w+)\s*=\s*(?P<init>[^;]+?)\s*;\s*(?P=var)\s*<(?!=)\s*"
                     r"(?P<bound>[^;]+?)\s*;\s*(?P=var)\s*\+\+\s*\)\s*")
_ACCUMULATE = re.compile(r"^(?P<acc>[A-Za-z_]\w*)\s*\+=\s*(?P<expr>[^;]+);$", re.S)
_DECLARE = re.compile(r"^float\s+(?P<acc>[A-Za-z_]\w*)\s*=\s*(?P<init>[^;]+);$", re.S)
_STORE = re.compile(r"^(?P<target>[A-Za-z_]\w*\s*\[[^;]+\])\s*=\s*(?P<acc>[A-Za-z_]\w*);$", re.S)
_KEYWORD = re.compile(r"^(for|if|while|do|else|switch)\b")


@dataclass(frozen=True)
class Loop:
    start: int  # index of "for"
    end: int  # index just past the loop's closing "}" or ";"
    var: str
    init: str
    bound: str
    body: str  # inside the braces (or the single statement)
    items: tuple[Loop | str, ...] | None  # the body as loops and simple statements; None: something else


def _uses(name: str, text: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def _matching_brace(source: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return i
    return -1


def _parse_loop(source: str, at: int) -> Loop | None:
    head = _HEADER.match(source, at)
    if head is None or _uses(head["var"], head["bound"]):
        return None  # a bound that moves with the loop (`p < 2 && i + p < H`) is not a simple trip count
    pos = head.end()
    if source.startswith("{", pos):
        close = _matching_brace(source, pos)
        if close < 0:
            return None
        body, end = source[pos + 1:close], close + 1
        items = _items(source, pos + 1, close)
    else:
        semi = source.find(";", pos)
        body = source[pos:semi + 1]
        if semi < 0 or "{" in body or _KEYWORD.match(body):
            return None
        end, items = semi + 1, (body.strip(),)
    return Loop(at, end, head["var"], head["init"].strip(), head["bound"].strip(), body, items)


def _items(source: str, start: int, end: int) -> tuple[Loop | str, ...] | None:
    """The statements between start and end when they are only canonical loops and brace-free statements."""
    found: list[Loop | str] = []
    pos = start
    while True:
        while pos < end and source[pos].isspace():
            pos += 1
        if pos >= end:
            return tuple(found)
        if source.startswith("for", pos):
            loop = _parse_loop(source, pos)
            if loop is None or loop.end > end:
                return None
            found.append(loop)
            pos = loop.end
            continue
        semi = source.find(";", pos, end)
        statement = source[pos:semi + 1]
        if semi < 0 or "{" in statement or "}" in statement or _KEYWORD.match(statement) \
                or statement.startswith("#"):
            return None
        found.append(" ".join(statement.split()))
        pos = semi + 1


def loops(source: str, from_index: int = 0) -> list[Loop]:
    """Every canonical loop from `from_index` on, outer loops before the loops inside them."""
    return [loop for m in _HEADER.finditer(source, from_index) if (loop := _parse_loop(source, m.start()))]


def _indent_of(source: str, at: int) -> str:
    line = source[source.rfind("\n", 0, at) + 1:at]
    return line if not line.strip() else ""


def _replace(source: str, loop: Loop, text: str) -> str:
    return source[:loop.start] + text + source[loop.end:]


def _block(lines: list[str], indent: str) -> str:
    """Lines (nested with 4 spaces per level already) re-indented under `indent`, minus the first line's."""
    return textwrap.indent("\n".join(lines), indent)[len(indent):]


def multiple_accumulators(source: str, from_index: int, ways: int = 4) -> str | None:
    """Split every `acc += expr` loop into `ways` independent partial sums plus a scalar tail loop."""
    targets: list[tuple[Loop, re.Match[str]]] = []
    for loop in loops(source, from_index):
        only = loop.items[0] if loop.items is not None and len(loop.items) == 1 else None
        m = _ACCUMULATE.match(only) if isinstance(only, str) else None
        if m is not None and not _uses(m["acc"], m["expr"]) and f"{m['acc']}_0" not in source:
            targets.append((loop, m))
    rewritten = source
    for loop, m in reversed(targets):  # back to front, so earlier offsets stay valid
        acc, expr, v = m["acc"], m["expr"].strip(), loop.var
        step = [re.sub(rf"\b{v}\b", f"({v} + {u})" if u else v, expr) for u in range(ways)]
        partials = ", ".join(f"{acc}_{u} = 0.0f" for u in range(ways))
        total = " + ".join(f"{acc}_{u}" for u in range(ways))
        lines = ["{",
                 f"    float {partials};",
                 f"    const int64_t {v}_end = {loop.init} + (({loop.bound}) - ({loop.init})) / {ways} * {ways};",
                 f"    for (int64_t {v} = {loop.init}; {v} < {v}_end; {v} += {ways}) {{",
                 *(f"        {acc}_{u} += {step[u]};" for u in range(ways)),
                 "    }",
                 f"    {acc} += {total};",
                 f"    for (int64_t {v} = {v}_end; {v} < {loop.bound}; {v}++) {acc} += {expr};",
                 "}"]
        rewritten = _replace(rewritten, loop, _block(lines, _indent_of(rewritten, loop.start)))
    return rewritten if targets else None


def interchange(source: str, from_index: int) -> str | None:
    """`for a { float s = s0; for b { s += e; } out[..] = s; }` becomes `for a out[..] = s0;` then
    `for b { for a { out[..] += e; } }`: the inner loop now walks what `a` indexes (rows of B in a matmul)."""
    for outer in loops(source, from_index):
        if outer.items is None or len(outer.items) != 3:
            continue
        declare, inner, store = outer.items
        if not (isinstance(declare, str) and isinstance(inner, Loop) and isinstance(store, str)):
            continue
        d, s = _DECLARE.match(declare), _STORE.match(store)
        body = inner.items[0] if inner.items is not None and len(inner.items) == 1 else None
        a = _ACCUMULATE.match(body) if isinstance(body, str) else None
        if d is None or s is None or a is None or not d["acc"] == s["acc"] == a["acc"] \
                or _uses(outer.var, inner.init + inner.bound) or _uses(d["acc"], a["expr"]):
            continue
        target = s["target"]
        head_a = f"for (int64_t {outer.var} = {outer.init}; {outer.var} < {outer.bound}; {outer.var}++)"
        head_b = f"for (int64_t {inner.var} = {inner.init}; {inner.var} < {inner.bound}; {inner.var}++)"
        lines = [f"{head_a} {target} = {d['init'].strip()};",
                 f"{head_b} {{",
                 f"    {head_a} {{",
                 f"        {target} += {a['expr'].strip()};",
                 "    }",
                 "}"]
        return _replace(source, outer, _block(lines, _indent_of(source, outer.start)))
    return None


def block(source: str, from_index: int, tile: int) -> str | None:
    """Tile the deepest perfect 2-deep nest (`for a { for b { ... } }`) into tile x tile blocks."""
    if "_tile" in source:
        return None  # already blocked (at some size)
    nests = [(outer, inner) for outer in loops(source, from_index)
             if outer.items is not None and len(outer.items) == 1 and isinstance(inner := outer.items[0], Loop)
             and not _uses(outer.var, inner.init + inner.bound)]
    if not nests:
        return None
    # The deepest: the first nest with no other nest inside it.
    outer, inner = next((o, i) for o, i in nests if not any(o.start < p.start < o.end for p, _ in nests))
    assert isinstance(inner, Loop)
    a, b = outer.var, inner.var

    def tiled(v: str, init: str, bound: str) -> tuple[str, str]:
        return (f"for (int64_t {v}_tile = {init}; {v}_tile < {bound}; {v}_tile += {tile})",
                f"for (int64_t {v} = {v}_tile; {v} < ({v}_tile + {tile} < {bound} ? {v}_tile + {tile} : {bound}); "
                f"{v}++)")
    tile_a, each_a = tiled(a, outer.init, outer.bound)
    tile_b, each_b = tiled(b, inner.init, inner.bound)
    body = textwrap.dedent(inner.body).strip("\n")
    lines = [f"{tile_a} {{", f"    {tile_b} {{", f"        {each_a} {{", f"            {each_b} {{",
             textwrap.indent(body, " " * 16), "            }", "        }", "    }", "}"]
    return _replace(source, outer, _block(lines, _indent_of(source, outer.start)))
