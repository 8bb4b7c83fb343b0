"""What the docs check against the code: environment variables read anywhere, the CLI's commands and options, the
code blocks of the Markdown pages, and the figure table of ``relaylens.reporting.figures``. Shared by the build
(docs/hooks/generate.py) and the tests (tests/test_docs.py).
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$")
# where relaylens's own variables are read: the package and the analyses, the notebooks, the test harness
ENV_SOURCES = ("relaylens", "notebooks", "tests/test_notebooks.py", "tests/conftest.py", "tests/support", "conftest.py")
MAPPING_NAMES = {"env", "environ"}  # a mapping of the environment passed around (relaylens.experiments.launch)


@dataclass(frozen=True)
class EnvRead:
    name: str
    path: str  # relative to the repository root
    line: int


def env_reads(root: Path = ROOT) -> list[EnvRead]:
    """Every environment variable read by the code: ``os.environ.get(X)``, ``os.environ[X]``, ``os.getenv(X)``,
    ``X in os.environ``, ``os.environ.pop/setdefault(X)``, and the same on a mapping of the environment named
    ``env``/``environ`` (also passed on as the first argument of a helper: ``_int(env, X)``). ``X`` is a string or a
    module-level string constant; only names that look like variables (``UPPER_CASE``) count."""
    found: list[EnvRead] = []
    for path, source in _sources(root):
        try:
            tree = ast.parse(source)
        except SyntaxError:  # notebook cells with shell magics
            continue
        constants = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            for arg in _env_keys(node):
                value = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", None))
                if isinstance(value, str) and ENV_NAME.match(value):
                    found.append(EnvRead(value, path, getattr(arg, "lineno", node.lineno)))
    return sorted(set(found), key=lambda r: (r.name, r.path, r.line))


def _is_environ(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
            and node.value.id == "os":
        return True
    return isinstance(node, ast.Name) and node.id in MAPPING_NAMES


def _env_keys(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault") and _is_environ(func.value):
            return node.args[:1]
        if isinstance(func, ast.Attribute) and func.attr == "getenv" and getattr(func.value, "id", None) == "os":
            return node.args[:1]
        if node.args and _is_environ(node.args[0]) and not isinstance(func, ast.Attribute):
            return [a for a in node.args[1:] if isinstance(a, ast.Constant)]
    if isinstance(node, ast.Subscript) and _is_environ(node.value):
        return [node.slice]
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
            and _is_environ(node.comparators[0]):
        return [node.left]
    return []


def _sources(root: Path):
    for entry in ENV_SOURCES:
        base = root / entry
        files = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for path in files:
            rel = path.relative_to(root).as_posix()
            if path.suffix == ".py":
                yield rel, path.read_text(encoding="utf-8")
            elif path.suffix == ".ipynb":
                cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
                code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
                yield rel, "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))


# ----------------------------------------------------------------------------------------------------- the CLI


def cli_commands() -> dict[str, object]:
    """``"run"``, ``"model pull"``, ... -> the click command of the typer app (the root is ``""``)."""
    import typer.main

    from relaylens.cli import app

    root = typer.main.get_command(app)
    out: dict[str, object] = {}

    def walk(command, path: str) -> None:
        out[path] = command
        if is_group(command):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}".strip())

    walk(root, "")
    return out


def is_group(command) -> bool:
    """A command with subcommands (typer ships its own copy of click, so no isinstance against click's classes)."""
    return hasattr(command, "commands")


def option_names(command) -> set[str]:
    names = {"--help"}
    for param in command.params:
        names.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("-"))
    return names


OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")
INSTALL = re.compile(r"\s*(?:\S*/)?(?:pip3?|uv pip|python3? -m pip)\s+install\b")


def check_cli_line(line: str, commands: dict[str, object]) -> list[str]:
    """Problems with one command line that calls ``relaylens`` (``[]`` usage brackets, placeholders and ``...``
    allowed): an unknown command, or an option the command does not have. Lines without ``relaylens`` pass."""
    if INSTALL.match(line):  # `pip install 'relaylens[kvpress]'` names the package, not the command
        return []
    tokens = _tokens(line)
    if "relaylens" not in tokens and not any(t.endswith("relaylens.cli") for t in tokens):
        return []
    start = tokens.index("relaylens") if "relaylens" in tokens else next(
        i for i, t in enumerate(tokens) if t.endswith("relaylens.cli"))
    words = tokens[start + 1:]
    path = ""
    while words and f"{path} {words[0]}".strip() in commands:
        path = f"{path} {words[0]}".strip()
        words = words[1:]
    command = commands[path]
    if is_group(command):
        if words and not words[0].startswith("-") and re.match(r"^[a-z]+$", words[0]):
            return [f"`relaylens {path} {words[0]}`: no such command (have: {', '.join(sorted(command.commands))})"]
        return []
    known = option_names(command)
    problems = []
    for word in words:
        if word.startswith("#"):
            break
        for option in OPTION.findall(word) if word.lstrip("[(|").startswith("-") else ():
            if option not in known:
                problems.append(f"`relaylens {path}` has no option {option}")
    return problems


def _tokens(line: str) -> list[str]:
    line = line.split(" #")[0]
    try:
        raw = shlex.split(line, comments=False)
    except ValueError:
        raw = line.split()
    out = []
    for token in raw:
        out.extend(t for t in re.split(r"[\[\]|]", token) if t)
    return out


# ------------------------------------------------------------------------------------------- Markdown code blocks


@dataclass(frozen=True)
class Block:
    path: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # the reason in a `<!-- docs-test: skip REASON -->` comment right above the block


FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)[^\n]*$")
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*(.*?)\s*-->")


def markdown_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def code_blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced code blocks of a Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1:j]]
        before = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        skip = SKIP.search(before)
        blocks.append(Block(path.relative_to(root).as_posix(), i + 1, lang.lower(), "\n".join(body),
                            skip.group(1) or "no reason given" if skip else None))
        i = j + 1
    return blocks


def shell_commands(code: str) -> list[str]:
    """The command lines of a shell block, continuation lines joined, heredoc bodies kept as their own lines."""
    out, current = [], ""
    for line in code.splitlines():
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        out.append(current + line)
        current = ""
    if current:
        out.append(current)
    return out


INLINE = re.compile(r"(?<!`)`(relaylens [^`]+)`(?!`)")


def inline_commands(path: Path) -> list[tuple[int, str]]:
    """``(line, command)`` for every inline code span of a page that starts with ``relaylens `` (outside code
    blocks)."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.extend((number, m.group(1)) for m in INLINE.finditer(line))
    return out


# ------------------------------------------------------------------------------------------- the figure table

FIGURE_TABLE_HOME = "relaylens.reporting.figures"
RULE = re.compile(r"^=+(?: +=+)+$")


def figure_table_problems(doc: str | None = None, entries: dict[str, tuple[str, str]] | None = None) -> list[str]:
    """What is wrong with the figure table of ``relaylens.reporting.figures``'s docstring (a reStructuredText simple
    table ``name kind file what``, the row a new figure adds itself to): a row off its columns, a row that names a
    figure the registry does not have or gives it another kind or file, a built-in figure without a row.

    ``doc`` and ``entries`` (``name -> (kind, file)``) default to the package's docstring and its built-in registry
    entries (plugins are not listed there)."""
    if doc is None or entries is None:
        face = importlib.import_module(FIGURE_TABLE_HOME)
        doc = face.__doc__ if doc is None else doc
        if entries is None:
            entries = {name: (e.kind, e.build.__module__.rpartition(".")[2]) for name, e in face.REGISTRY.items()
                       if e.build.__module__.startswith(FIGURE_TABLE_HOME + ".")}
    lines = doc.splitlines()
    rules = [i for i, line in enumerate(lines) if RULE.match(line)]
    if len(rules) != 3 or any(lines[i] != lines[rules[0]] for i in rules):
        return [f"{FIGURE_TABLE_HOME}: the figure table needs three equal rule lines (top, under the header, bottom); "
                f"found {len(rules)}. Fix: restore the table (name kind file what) in its docstring"]
    spans = [(m.start(), m.end()) for m in re.finditer(r"=+", lines[rules[0]])]
    problems, rows = [], {}
    for number, line in enumerate(lines[rules[1] + 1:rules[2]], rules[1] + 2):
        if not line.strip():
            continue
        cells = [line[a:b] for a, b in spans[:-1]] + [line[spans[-1][0]:]]
        gaps = [line[b:c] for (_, b), (c, _) in zip(spans, spans[1:])]
        if any(g.strip() for g in gaps) or any(c != c.strip() and c.strip() and c[0] == " " for c in cells[:-1]):
            problems.append(f"{FIGURE_TABLE_HOME} docstring line {number}: a cell runs over its column: {line!r}. "
                            "Fix: align it under the rule's columns (wrap the 'what' text onto a line whose first "
                            "three columns are blank)")
            continue
        name, kind, file, _ = (c.strip() for c in cells)
        if not name:  # a continuation of the 'what' text
            if kind or file:
                problems.append(f"{FIGURE_TABLE_HOME} docstring line {number}: a continuation line fills the kind or "
                                f"file column: {line!r}")
            continue
        rows[name] = (kind, file)
    for name, (kind, file) in sorted(rows.items()):
        if name not in entries:
            problems.append(f"{FIGURE_TABLE_HOME}: the figure table lists {name!r}, which is not registered")
        elif entries[name] != (kind, file):
            problems.append(f"{FIGURE_TABLE_HOME}: the figure table gives {name!r} kind and file {(kind, file)}; the "
                            f"registry has {entries[name]}")
    for name in sorted(set(entries) - set(rows)):
        problems.append(f"{FIGURE_TABLE_HOME}: figure {name!r} ({', '.join(entries[name])}) has no row in the figure "
                        "table. Fix: add it (name kind file what) to the docstring's table")
    return problems
