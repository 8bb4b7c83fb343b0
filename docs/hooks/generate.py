"""The generated pages of the site and the placeholders of hand-written pages (see relaylens_docs.py)."""

from __future__ import annotations

import html
import importlib
import inspect
import json
import re
import warnings
from pathlib import Path
from typing import Callable
from urllib.parse import quote

import codescan
import griffe_roles

ROOT = codescan.ROOT
API_PAGES = griffe_roles.API_PAGES
ENV_DESCRIPTIONS = ROOT / "docs" / "reference" / "environment.yml"
Warn = Callable[[str], None]


def pages(warn: Warn) -> dict[str, str]:
    """Every generated page: ``src_uri -> Markdown``."""
    out = {"reference/cli.md": cli_page(), "reference/run-directory.md": run_directory_page(),
           "reference/errors.md": errors_page(), "reference/environment.md": environment_page(warn)}
    out.update(api_pages(warn))
    for problem in codescan.figure_table_problems():  # the table a new figure adds its row to (--strict fails)
        warn(problem)
    return out


def _banner(source: str) -> str:
    return (f"<!-- generated at build time from {source} by docs/hooks/generate.py: edit the code, not this page -->\n"
            f'!!! note "Generated from `{source}` at build time"\n')


# ----------------------------------------------------------------------------------------------------------- CLI


def cli_page() -> str:
    commands = codescan.cli_commands()
    root = commands[""]
    lines = ["# Command line", "", _banner("relaylens/cli/"),
             f"`relaylens` is the typer app `relaylens.cli:app`. {root.help}", "",
             "Every command prints where its output went; errors from bad input are one line with exit status 2.", "",
             "| command | what it does |", "|---|---|"]
    leaves = {path: c for path, c in commands.items() if path and not codescan.is_group(c)}
    for path, command in leaves.items():
        lines.append(f"| [`relaylens {path}`](#{_anchor(path)}) | {_first_line(command.help)} |")
    for path, command in leaves.items():
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        options = [p for p in command.params if p.param_type_name == "option" and not p.hidden]
        usage = " ".join(["[OPTIONS]"] + [_argument(p) for p in arguments])
        lines += ["", f"## relaylens {path} {{#{_anchor(path)}}}", "", "```text", f"relaylens {path} {usage}", "```",
                  "", _help_text(command.help), ""]
        if arguments:
            lines += ["| argument | meaning |", "|---|---|"]
            for p in arguments:
                lines.append(f"| `{_argument(p)}` | {_cell(p.help or '')} |")
            lines.append("")
        panels: dict[str, list] = {}
        for p in options:
            panels.setdefault(p.rich_help_panel or "Options", []).append(p)
        for panel, params in panels.items():
            lines += [f"**{panel}**", "", "| option | default | meaning |", "|---|---|---|"]
            for p in params:
                names = " / ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
                meta = "" if p.is_flag else f" `{p.name.upper()}`"
                more = " (repeatable)" if p.multiple else ""
                lines.append(f"| {names}{meta} | {_default(p)} | {_cell(p.help or '')}{more} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def _argument(p) -> str:
    name = p.name.upper() + ("..." if p.nargs == -1 else "")
    return name if p.required else f"[{name}]"


def _anchor(path: str) -> str:
    return "relaylens-" + path.replace(" ", "-")


def _first_line(text: str | None) -> str:
    return _cell((text or "").strip().split("\n\n")[0].replace("\n", " "))


def _help_text(text: str | None) -> str:
    return "\n\n".join(p.replace("\n", " ").strip() for p in (text or "").replace("\b\n", "").split("\n\n"))


def _default(p) -> str:
    if p.is_flag:
        return "on" if p.default else ""
    if p.default is None or p.default == () or p.default == []:
        return ""
    value = p.default() if callable(p.default) else p.default
    return f"`{value}`" if value not in (None, "") else ""


def _cell(text: str) -> str:
    return html.escape(text.replace("\n", " "), quote=False).replace("|", "\\|")


# ----------------------------------------------------------------------------------------------------------- API


def load_package():
    import griffe

    return griffe.load("relaylens", search_paths=[str(ROOT)], resolve_aliases=True, resolve_external=False,
                       docstring_parser="google")


def api_pages(warn: Warn) -> dict[str, str]:
    import relaylens

    pkg = load_package()
    links = griffe_roles.rendered_paths(pkg)
    own = dict(griffe_roles.face_only(pkg))
    lines = ["# Python API: the public face", "", _banner("relaylens/__init__.py (relaylens.__all__)"),
             "Every name below imports from `relaylens` itself (`from relaylens import load_model`); each lives in "
             "the module of its stage. Names load on first use, so `import relaylens` stays light and code that only "
             "reads result tables never imports torch. Each name links to its entry on its stage's page (left), "
             "which also documents the stage's contract and its other public names.", ""]
    for stage, names in _public_face_groups(relaylens).items():
        lines += [f"## {stage}", "", "| name | home | summary |", "|---|---|---|"]
        for name in names:
            home = relaylens._EXPORTS[name]
            target = pkg[f"{home[len('relaylens.'):]}.{name}"]
            summary = _summary(target)
            lines.append(f"| [`{name}`][{links[f'{home}.{name}']}] | `{home}` | {summary} |")
        lines.append("")
        for name in names:
            if name in own:
                lines += [f"::: {own[name]}.{name}", "    options:", "      heading_level: 3", ""]
    out = {"reference/api/index.md": "\n".join(lines)}
    for page in API_PAGES:
        module = importlib.import_module(f"relaylens.{page}")
        body = [f"# relaylens.{page}", "", _banner(f"relaylens/{page}"), f"::: relaylens.{page}",
                "    options:", "      show_root_heading: false", "      heading_level: 2"]
        if getattr(module, "__all__", None) is None:
            body += ["      members:", *(f"        - {n}" for n in griffe_roles.page_members(pkg[page]))]
        out[f"reference/api/{page}.md"] = "\n".join(body) + "\n"
    for problem in missing_docstrings(pkg):
        warn(problem)
    return out


def _summary(obj) -> str:
    target = obj.final_target if obj.is_alias else obj
    doc = target.docstring.value.strip() if target.docstring else ""
    first = doc.split("\n\n")[0].replace("\n", " ")
    first = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", first)
    return _cell(first.split(". ")[0].rstrip(".") + ".") if first else ""


def _public_face_groups(relaylens) -> dict[str, list[str]]:
    """The public face's names by stage (the first part of their home module), in the order of ``_HOMES``."""
    groups: dict[str, list[str]] = {}
    for module, names in relaylens._HOMES.items():
        groups.setdefault(module.split(".")[0], []).extend(names)
    return groups


def missing_docstrings(pkg) -> list[str]:
    """``name is public but has no docstring`` for every object an API page renders (the public face, each page's
    members), as griffe sees them."""
    problems = []
    pages = {f"relaylens.{page}" for page in API_PAGES}
    for path in sorted(set(griffe_roles.rendered_paths(pkg).values())):
        if path not in pages and path.rsplit(".", 1)[0] not in pages | set(dict(griffe_roles.face_only(pkg)).values()):
            continue  # a member of a class: documented by its class
        obj = pkg[path[len("relaylens."):]]
        target = obj.final_target if obj.is_alias else obj
        if target.docstring is None or not target.docstring.value.strip():
            problems.append(f"{path} is public but has no docstring ({target.relative_filepath}:{target.lineno}): "
                            "write one (the API reference renders it)")
    return problems


# ----------------------------------------------------------------------------------------- run directory, tables


def run_directory_page() -> str:
    from relaylens.results import locks, shards, store, tables, views

    t = tables
    lines = ["# Run directory and tables", "", _banner("relaylens/results (tables.py, store.py, manifest.py, "
                                                       "shards.py, locks.py, views.py)"),
             "A run directory is what `relaylens run` (and `sweep`, `merge`, `judge`) writes and what `relaylens "
             "figures`, `relaylens report` and `relaylens.load_tables` read.",
             "", "```text", "RUN_DIR/",
             "  manifest.json            what produced the run: analysis, config, model and weights hash, dataset hash,"
             " versions, source state",
             f"  {store.UNITS}/<hash>.json.gz     one committed unit = every condition of one "
             "(record_id, selector, budget)"]
    lines += [f"  {name}.parquet{' ' * (16 - len(name))}consolidated table `{name}`"
              f"{' (only when a unit was skipped)' if name in t.OPTIONAL_TABLES else ''}" for name in t.TABLES]
    lines += ["  consolidated.json        written last: the unit hashes the parquet files contain",
              f"  {views.VIEWS}/*.json             token views of the first records (--view-records)",
              f"  {shards.SHARDS}/I-of-N/            shard run directories (--shard auto, relaylens sweep) "
              "until merged",
              f"  {locks.LOCK_NAME}          the writer's lock (run, merge, report, figures, judge)",
              "  report.html, figure*.png|pdf|svg, table*.csv|md   written by relaylens report / relaylens figures",
              "```", "", "## How units are committed", "", _docstring_body(store.__doc__), ""]
    lines += ["## Tables", "", "Every table is long format, one parquet file each. Kinds: `int` (int64), `float` "
              "(float64, missing values NaN), `bool`, `str`, `str?` (may be None). **Key**: the row identity and sort "
              "order (`SORT_COLUMNS`); no two rows share it.", ""]
    meanings = _answer_meanings(t.__doc__)
    prose = _table_prose(t.__doc__)
    for name, columns in t.TABLES.items():
        key = t.SORT_COLUMNS[name]
        lines += [f"### `{name}`", "", prose.get(name, ""), "", "| column | kind | key | meaning |",
                  "|---|---|---|---|"]
        for column in columns:
            note = meanings.get(column, "") if name == "answers" else ""
            if column in t.TIMING_COLUMNS:
                note = (note + " (timing: excluded from determinism checks)").strip()
            if column in t.LATER_COLUMNS:
                note += f" Tables written before it existed read `{t.LATER_COLUMNS[column]}`."
            lines.append(f"| `{column}` | `{t.DTYPES[column]}` | {'yes' if column in key else ''} | {note} |")
        lines.append("")
    lines += ["Read a run's tables with `relaylens.load_tables(run_dir)`; fabricate tables of this schema with "
              "`relaylens.example_tables()` (both on the [Python API](api/index.md) page).", ""]
    return "\n".join(lines)


def _docstring_body(doc: str) -> str:
    text = inspect.cleandoc(doc or "")
    text = text.split("\nExample:")[0]
    paragraphs = text.split("\n\n")
    return "\n\n".join(p for p in paragraphs[1:] if not p.rstrip().endswith("::") and not p.startswith("    "))


def _answer_meanings(doc: str) -> dict[str, str]:
    meanings = {}
    for row in re.findall(r"^\| ([^|]+) \| ([^|]+) \| (.+) \|$", doc, re.M):
        names, _, meaning = (c.strip() for c in row)
        for name in (n.strip() for n in names.split(",")):
            meanings[name] = meaning
    return meanings


def _table_prose(doc: str) -> dict[str, str]:
    out = {}
    for paragraph in inspect.cleandoc(doc).split("\n\n"):
        match = re.match(r"``(\w+)`` —", paragraph)
        if match and "|" not in paragraph:
            out[match.group(1)] = paragraph.replace("\n", " ")
    return out


# ---------------------------------------------------------------------------------------------------------- errors


def errors_page() -> str:
    import pkgutil

    import relaylens
    from relaylens.errors import RelaylensError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for info in pkgutil.walk_packages(relaylens.__path__, "relaylens."):
            if ".analyses" not in info.name:
                importlib.import_module(info.name)
    lines = ["# Errors", "", _banner("relaylens/errors.py and every module that subclasses RelaylensError"),
             inspect.cleandoc(importlib.import_module("relaylens.errors").__doc__).split("\n\n")[1], "",
             "On the command line every `RelaylensError` is printed as one line, `error: ...`, with exit status 2. "
             "Any other exception is a bug: the command prints `relaylens: internal error (TYPE); this is a bug: "
             "please report it ...` on stderr, then its traceback, and exits with status 1.",
             "", "```text"]
    entries = []

    def walk(cls, depth: int) -> None:
        lines.append("    " * depth + f"{cls.__name__}  ({cls.__module__})")
        entries.append(cls)
        for sub in sorted(cls.__subclasses__(), key=lambda c: c.__name__):
            if sub.__module__.startswith("relaylens"):
                walk(sub, depth + 1)

    lines.append("ValueError")
    walk(RelaylensError, 1)
    lines += ["```", "", "| error | module | raised when |", "|---|---|---|"]
    for cls in entries:
        doc = " ".join(inspect.cleandoc(cls.__doc__ or "").split())
        doc = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", doc)
        lines.append(f"| `{cls.__name__}` | `{cls.__module__}` | {_cell(doc).replace('&lt;', '<')} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- environment variables


def env_descriptions() -> dict[str, dict]:
    import yaml

    return yaml.safe_load(ENV_DESCRIPTIONS.read_text(encoding="utf-8")) or {}


def environment_page(warn: Warn) -> str:
    reads = codescan.env_reads()
    described = env_descriptions()
    where: dict[str, list[codescan.EnvRead]] = {}
    for read in reads:
        where.setdefault(read.name, []).append(read)
    for name in sorted(set(where) - set(described)):
        warn(f"environment variable {name} is read at {where[name][0].path}:{where[name][0].line} but not described in "
             f"{ENV_DESCRIPTIONS.relative_to(ROOT)}")
    for name in sorted(set(described) - set(where)):
        warn(f"{ENV_DESCRIPTIONS.relative_to(ROOT)} describes {name}, which no code reads")
    groups: dict[str, list[str]] = {}
    for name, entry in described.items():
        groups.setdefault(entry.get("group", "other"), []).append(name)
    lines = ["# Environment variables", "", _banner("the code: every os.environ read, found by docs/hooks/codescan.py"),
             "Every variable the package, the notebooks or the test harness read, with where. The list is found in "
             "the code at build time; the descriptions live in `docs/reference/environment.yml`, and the build fails "
             "when a variable is read but not described there, or described but never read.", ""]
    for group, names in groups.items():
        lines += [f"## {group}", "", "| variable | meaning | read in |", "|---|---|---|"]
        for name in sorted(names):
            files = sorted({r.path for r in where.get(name, [])})
            lines.append(f"| `{name}` | {_cell(described[name]['meaning'].strip())} | "
                         + ", ".join(f"`{f}`" for f in files) + " |")
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- placeholders


PLACEHOLDER = re.compile(r"^<!--\s*relaylens:(\w+)\s*([^>]*?)\s*-->$", re.M)  # alone on its line


def expand(markdown: str, src_uri: str, warn: Warn) -> str:
    def replace(match: re.Match) -> str:
        kind, argument = match.groups()
        if kind == "presets":
            from relaylens.experiments.presets import preset_markdown

            return preset_markdown()
        if kind == "analyses":
            return analyses_table()
        if kind == "formats":
            return formats_table()
        if kind == "selectors":
            return selectors_table()
        if kind == "run":
            return run_section(argument, src_uri, warn)
        warn(f"{src_uri}: unknown placeholder relaylens:{kind}")
        return ""

    return PLACEHOLDER.sub(replace, markdown)


def formats_table() -> str:
    import sys

    from relaylens.datasets import REGISTRY

    lines = ["| format (`--format`) | reader | reads | bundled sample (`--data sample:NAME`) |", "|---|---|---|---|"]
    for name, fmt in REGISTRY.items():
        module = sys.modules[fmt.reader.__module__]
        first = inspect.cleandoc(module.__doc__ or "").split("\n\n")[0].replace("\n", " ").replace("``", "`")
        sample = f"`{fmt.sample().relative_to(ROOT).as_posix()}`" if fmt.sample else "—"
        lines.append(f"| `{name}` | `{module.__name__}` | {_cell(first)} | {sample} |")
    return "\n".join(lines)


def selectors_table() -> str:
    from relaylens.selectors import REGISTRY

    lines = ["| name | class | what each (layer, kv head) keeps |", "|---|---|---|"]
    for name, cls in REGISTRY.items():
        first = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        first = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", first).replace("``", "`").replace("|", "\\|")
        lines.append(f"| `{name}` | `{cls.__module__}.{cls.__name__}` | {first} |")
    return "\n".join(lines)


def analyses_table() -> str:
    from relaylens.experiments.presets import apply_preset
    from relaylens.experiments.specs import available_analyses, load_analysis

    lines = ["| analysis | paper | what it measures | command (CPU default) | rows at the default "
             "| rows with `--preset paper` |", "|---|---|---|---|---|---|"]
    for name in available_analyses():
        analysis = load_analysis(name)
        spec = analysis.spec
        paper = analysis.presets.get("paper")
        paper_spec = apply_preset(analysis, "paper") if paper else None
        figures = ", ".join(spec.figures) or "—"
        what = _cell(spec.description.split(". ")[0].rstrip(".")) if spec.description else ""
        lines.append(f"| `{name}` | {figures} | {what} | `relaylens run {name}` | {_work(spec, spec.limit)} | "
                     f"{_work(paper_spec, _paper_records(paper)) if paper_spec else '—'} |")
    return "\n".join(lines)


def _paper_records(preset) -> int | None:
    numbers = [int(n.replace(",", "")) for n in re.findall(r"(\d[\d,]*)(?: each)?(?=[,;)]|$)", preset.paper_data)
               if int(n.replace(",", "")) >= 20]
    return max(numbers) if numbers else None


def _work(spec, records) -> str:
    """Prefills and rows (a row = one condition's question pass and greedy decoding) of a run of ``records`` records."""
    per_record = len(spec.selectors) * len(spec.budgets) * len(spec.conditions)
    tokens = f", up to {spec.max_new_tokens:,} new tokens each"
    if not records:
        return f"{per_record} rows per record{tokens}"
    return f"{records} records x {per_record} = {records * per_record:,} rows{tokens}"


# Text from committed runs and data files (manifests, index.json, the tables' cells, file and folder names) is data:
# it reaches the site as text, never as live HTML or markup (issue 41). Code and hand-written pages are trusted.
_PLAIN = re.compile(r"[\w./:+@%,=()\- ]*")  # nothing markdown, HTML, a snippet include or an attribute list reads
_SAFE_PUNCTUATION = set(".,:;/%+-=()?@ ")


def _one_line(value) -> str:
    """``value`` as one line of text: control and format characters (line breaks included) as visible escapes."""
    from relaylens.errors import shown

    return shown("" if value is None else str(value))


def _text(value) -> str:
    """Data as plain text in Markdown: letters, digits, spaces and harmless punctuation as they are, every other
    character as a numeric character reference (so ``<``, backticks, ``|``, ``*``, ``[``, ``{``, ``--8<--`` start
    nothing; the page shows the same characters)."""
    return "".join(ch if ch.isalnum() or ch in _SAFE_PUNCTUATION else f"&#{ord(ch)};" for ch in _one_line(value))


def _code(value) -> str:
    """Data as inline code: backticks when it holds nothing Markdown or HTML could read (the usual case, unchanged),
    else ``<code>`` around :func:`_text` (a backtick in the data cannot close the span)."""
    text = _one_line(value)
    return f"`{text}`" if _PLAIN.fullmatch(text) and text.strip() else f"<code>{_text(text)}</code>"


def _run_facts(manifest: dict) -> list[tuple[str, str]]:
    """What produced a run, from its manifest: (label, markdown value) pairs, every value escaped (:func:`_text`)."""
    config = manifest.get("config", {})
    spec, runcfg = config.get("spec", {}), config.get("run", {})
    versions, limit = manifest.get("versions", {}), runcfg.get("limit") or spec.get("limit") or "all"
    return [("analysis", _code(manifest.get("analysis"))), ("model", _code(manifest.get("model", {}).get("spec"))),
            ("data", f"{_code(runcfg.get('data'))} ({_text(limit)} records)"),
            ("selectors x budgets", f"{_text(', '.join(map(str, spec.get('selectors', []))))} x "
                                    f"{_text(', '.join(str(b) for b in spec.get('budgets', [])))}"),
            ("conditions", ", ".join(_code(c) for c in spec.get("conditions", []))),
            ("prompt mode", _code(spec.get("prompt_mode"))),
            ("produced", f"{_text(str(manifest.get('created_at', '?'))[:10])}, commit "
                         f"{_code(str(manifest.get('git_commit') or '?')[:10])}, torch {_text(versions.get('torch'))}, "
                         f"transformers {_text(versions.get('transformers'))}")]


def _listed_files(run: Path, folder: str, index: dict, warn: Warn, src_uri: str) -> list[str]:
    """The names ``index.json`` lists that name files of the folder itself (no path, no hidden file; a table must
    exist, as it is read); any other name is a warning (a failed strict build) and is left out, so no listed name
    reads or links a file elsewhere."""
    names = []
    for name in index.get("files", []):
        plain = isinstance(name, str) and name == Path(name).name and not name.startswith(".")
        if plain and (not name.endswith(".md") or (run / name).is_file()):
            names.append(name)
        else:
            warn(f"{src_uri}: relaylens:run {folder}: index.json lists {_one_line(repr(name))}, which is not a file "
                 "of the folder; left out")
    return names


def _table_text(table: str) -> list[str]:
    """A figures folder's ``.md`` table (a bold title, a pipe table, notes) with every cell and note as text."""
    lines = []
    for line in table.splitlines():
        bold = re.fullmatch(r"\*\*(.+)\*\*", line)
        if bold:
            lines.append(f"**{_text(bold.group(1))}**")
        elif re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line):
            lines.append(line)
        elif line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line.strip().removeprefix("|").removesuffix("|"))
            lines.append("| " + " | ".join(_text(c.strip().replace("\\|", "|")) for c in cells) + " |")
        else:
            lines.append(_text(line) if line.strip() else "")
    return lines


def _alt(name: str) -> str:
    """A file name as an image's alt text: only word characters, dots, plus, minus and spaces (nothing ends it)."""
    return re.sub(r"[^\w.+ -]", "", name)


def _drawn_files(run: Path, folder: str, index: dict, up: str, warn: Warn, src_uri: str) -> list[str]:
    """The figures (inline), tables (collapsed) and file links of a figures folder, from its ``index.json``."""
    names = _listed_files(run, folder, index, warn, src_uri)
    url = {name: f"{up}{folder}/{quote(name)}" for name in names}
    lines = []
    for name in names:
        if name.endswith(".png"):
            lines += [f"![{_alt(name)} of {folder}]({url[name]})", ""]
    for name in names:
        if name.endswith(".md"):
            table = _table_text((run / name).read_text(encoding="utf-8").strip())
            lines += [f'??? abstract "The table {_code(f"{folder}/{name}")}"', "",
                      *("    " + ln if ln else "" for ln in table), ""]
    files = [f"[{_code(name)}]({url[name]})" for name in names if name.endswith((".png", ".svg"))]
    if (run / "report.html").is_file():
        files.insert(0, f"[the HTML report]({up}{folder}/report.html)")
    lines.append("Files: " + ", ".join(files) + f"; tables and manifest in `{folder}/` of the repository.")
    return lines


def run_section(folder: str, src_uri: str, warn: Warn) -> str:
    """A committed run of ``figures/``: what produced it (from its manifest), its figures and its tables.

    A folder without a manifest whose ``index.json`` says ``cross-run`` (``relaylens figures RUN ... --out DIR``
    with the runs committed in its subfolders) gets one row of facts per subfolder run, then its cross-run
    figures and tables."""
    run = ROOT / folder
    index = json.loads((run / "index.json").read_text(encoding="utf-8")) if (run / "index.json").is_file() else {}
    up = "../" * src_uri.count("/")
    if not (run / "manifest.json").is_file():
        subruns = sorted(p for p in run.iterdir() if (p / "manifest.json").is_file()) if run.is_dir() else []
        if index.get("analysis") != "cross-run" or not subruns:
            warn(f"{src_uri}: relaylens:run {folder}: no manifest.json there (nor a cross-run index.json with runs "
                 "in subfolders)")
            return ""
        rows = [(p.name, dict(_run_facts(json.loads((p / "manifest.json").read_text(encoding="utf-8")))))
                for p in subruns]
        keys = [k for k, _ in _run_facts({})]
        lines = ["| run folder | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|",
                 *[f"| {_code(f'{folder}/{name}/')} | " + " | ".join(facts[k] for k in keys) + " |"
                   for name, facts in rows], ""]
        return "\n".join(lines + _drawn_files(run, folder, index, up, warn, src_uri))
    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    lines = [f"| run folder | `{folder}/` |", "|---|---|", *[f"| {k} | {v} |" for k, v in _run_facts(manifest)], ""]
    return "\n".join(lines + _drawn_files(run, folder, index, up, warn, src_uri))
