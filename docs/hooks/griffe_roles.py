"""A griffe extension: relaylens's docstrings, written for reading in a terminal (reST roles, ``::`` literal blocks,
reST simple tables), turned into the Markdown that mkdocstrings renders.

* ``:class:`~relaylens.x.Y``` (also ``:func:``, ``:mod:``, ``:meth:``, ``:data:``, ``:attr:``, ``:exc:``) becomes a
  cross-reference ``[`Y`][relaylens.x.Y]`` when its target is rendered on an API page (:data:`RENDERED` is filled
  from the package: the public face and every stage's ``__all__``), else a plain code span: mkdocs --strict fails on
  a link to nothing, so only links that resolve are written.
* ``text::`` followed by an indented block becomes ``text:`` and a fenced block.
* reST simple tables (``====  ====`` borders) become Markdown tables.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|func|mod|meth|data|attr|exc|obj):`(~?)([^`]+)`")
BORDER = re.compile(r"^( *)(=+)( +=+)+ *$")


API_PAGES = ("datasets", "model", "selectors", "geometry", "conditions", "generation", "probes", "scoring", "results",
             "reporting", "experiments", "integrations", "bench", "errors", "testing")
"""The modules with a page of their own under reference/api/ (the stages, then two root modules)."""


def page_members(module: griffe.Module) -> list[str]:
    """The names a module's API page renders: its ``__all__``, else its public functions and classes."""
    exports = _all(module)
    if exports:
        return [name for name in exports if name in module.members]
    return [n for n, m in module.members.items() if not n.startswith("_") and not m.is_alias
            and (m.is_function or m.is_class)]


def face_only(pkg: griffe.Module) -> list[tuple[str, str]]:
    """``(name, home)`` of the public face's names that no stage page renders (they get their entry on the public
    face page): a name whose stage does not export it, or exports another object under it."""
    import relaylens

    out = []
    for name, home in relaylens._EXPORTS.items():
        relative = home[len("relaylens."):]
        stage = relative.split(".")[0]
        target = pkg[f"{relative}.{name}"]
        target_path = target.final_target.path if target.is_alias else target.path
        member = pkg[stage].members.get(name) if stage in API_PAGES else None
        shown = member is not None and name in page_members(pkg[stage]) and (
            (member.final_target.path if member.is_alias else member.path) == target_path)
        if not shown:
            out.append((name, home))
    return out


def rendered_paths(pkg: griffe.Module) -> dict[str, str]:
    """Every path an API page renders an object under, and every canonical path of such an object, mapped to the
    identifier its entry has on the site (what a cross-reference must name)."""
    links: dict[str, str] = {}

    def add(obj: Any, shown: str) -> None:
        try:
            target = obj.final_target if obj.is_alias else obj
        except Exception:  # an alias to something outside the package: rendered under its shown path only
            links[shown] = shown
            return
        if target.is_module:  # a submodule of the same name as an exported function: not rendered
            return
        links[shown] = shown
        links.setdefault(target.path, shown)
        if target.is_class:
            for name in target.members:
                if not name.startswith("_"):
                    links[f"{shown}.{name}"] = f"{shown}.{name}"
                    links.setdefault(f"{target.path}.{name}", f"{shown}.{name}")

    for page in API_PAGES:
        module = pkg[page]
        links[module.path] = module.path
        for name in page_members(module):
            add(module.members[name], f"{module.path}.{name}")
    for name, home in face_only(pkg):
        add(pkg[f"{home[len('relaylens.'):]}.{name}"], f"{home}.{name}")
    return links


def _all(mod: griffe.Module) -> list[str]:
    exports = mod.exports
    return [e if isinstance(e, str) else e.name for e in exports] if exports else []


def convert(text: str, obj: Any, rendered: dict[str, str]) -> str:
    text = _doctests(text)
    text = ROLE.sub(lambda m: _role(m, obj, rendered), text)
    text = _literal_blocks(text)
    return _tables(text)


def _role(match: re.Match, obj: Any, rendered: dict[str, str]) -> str:
    kind, short, target = match.groups()
    target = target.strip()
    shown = target.rsplit(".", 1)[-1] if short else target
    if kind == "meth" or kind == "func":
        shown += "()" if not shown.endswith(")") else ""
    path = _resolve(target, obj)
    if path in rendered:
        return f"[`{shown}`][{rendered[path]}]"
    return f"`{shown}`"


def _resolve(target: str, obj: Any) -> str | None:
    if target.startswith("relaylens"):
        return target
    head, _, rest = target.partition(".")
    for scope in (obj, getattr(obj, "parent", None), getattr(obj, "module", None)):
        if scope is None:
            continue
        try:
            base = scope.resolve(head)
        except Exception:
            continue
        return f"{base}.{rest}" if rest else base
    return None


def _doctests(text: str) -> str:
    """Runs of ``>>>`` lines (with their ``...`` continuations and expected output) as fenced ``pycon`` blocks."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith(">>>"):
            out.append(lines[i])
            i += 1
            continue
        indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
        j = i
        while j < len(lines) and lines[j].strip():
            j += 1
        if out and out[-1].strip():
            out.append("")
        out += [indent + "```pycon", *lines[i:j], indent + "```"]
        i = j
    return "\n".join(out)


def _literal_blocks(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and not line.strip().startswith((">>>", "...")) and "```" not in line:
            indent = len(line) - len(line.lstrip())
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            block = []
            while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
                block.append(lines[j])
                j += 1
            while block and not block[-1].strip():
                block.pop()
            if block:
                stripped = line.rstrip()[:-2].rstrip()
                if stripped.strip():
                    out.append(stripped + ":")
                out.append("")
                inner = min(len(b) - len(b.lstrip()) for b in block if b.strip())
                out.append(" " * indent + "```text")
                out.extend(" " * indent + b[inner:] if b.strip() else "" for b in block)
                out.append(" " * indent + "```")
                out.append("")
                i = j
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _tables(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = BORDER.match(lines[i])
        if not match:
            out.append(lines[i])
            i += 1
            continue
        border = lines[i]
        spans = [(m.start(), m.end()) for m in re.finditer(r"=+", border)]
        borders = [i]
        j = i + 1
        while j < len(lines) and len(borders) < 3:
            if lines[j].strip() == border.strip() and BORDER.match(lines[j]):
                borders.append(j)
            elif not lines[j].strip():
                break
            j += 1
        if len(borders) < 3:  # not a header + body table: leave it
            out.append(lines[i])
            i += 1
            continue
        header = _rows(lines[borders[0] + 1:borders[1]], spans)
        body = _rows(lines[borders[1] + 1:borders[2]], spans)
        indent = match.group(1)
        out.append("")
        for k, row in enumerate(header[:1] + body):
            out.append(indent + "| " + " | ".join(cell or " " for cell in row) + " |")
            if k == 0:
                out.append(indent + "|" + "|".join("---" for _ in spans) + "|")
        out.append("")
        i = borders[2] + 1
    return "\n".join(out)


def _rows(lines: list[str], spans: list[tuple[int, int]]) -> list[list[str]]:
    rows: list[list[str]] = []
    for line in lines:
        cells = []
        for k, (start, end) in enumerate(spans):
            stop = spans[k + 1][0] if k + 1 < len(spans) else len(line)
            cells.append(line[start:stop].strip())
        if rows and not cells[0]:  # a continuation line: joins the row above
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
        else:
            rows.append(cells)
    return rows


class RelaylensDocstrings(griffe.Extension):
    """Rewrites every docstring of the package once it is loaded (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "relaylens":
            return
        rendered = rendered_paths(pkg)
        seen: set[int] = set()

        def walk(obj: Any) -> None:
            if id(obj) in seen or obj.is_alias:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = convert(obj.docstring.value, obj, rendered)
            for member in obj.members.values():
                walk(member)

        walk(pkg)
