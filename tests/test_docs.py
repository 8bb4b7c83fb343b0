"""The documentation cannot drift silently: README.md and every page under docs/ are checked against the code.

* Python code blocks run, page by page in one namespace (``pycon`` blocks as doctests), in the notebooks' smoke mode:
  ``relaylens.load_model`` returns the tiny random model of :mod:`relaylens.testing`, so the README's quickstart runs
  in seconds. ``<!-- docs-test: skip REASON -->`` right above a block skips it.
* Every ``relaylens ...`` command line in a shell block or an inline code span names a command of the typer app and
  only options that command has.
* Every repository path a page names in backticks (``relaylens/...``, ``tests/...``, ``notebooks/...``, ...) exists.
* The environment variables the code reads and those ``docs/reference/environment.yml`` describes are the same set;
  every public name the API pages render has a docstring; the README stays under 10,000 characters.

The built site itself (links, assets, search) is checked by tests/browser/test_docs_browser.py. Each checker is
also tested on a planted mistake, so a checker that stops seeing problems fails here.
"""

from __future__ import annotations

import doctest
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "hooks"))

import codescan  # noqa: E402 - docs/hooks/, shared with the site build

PAGES = codescan.markdown_files(ROOT)
RUNNABLE = ("python", "pycon")
SHELL = ("bash", "sh", "shell", "console")
PATH = re.compile(r"`((?:relaylens|tests|notebooks|figures|analyses|docs)/[\w./*<>-]*)`")


def _id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.fixture(scope="module")
def commands():
    return codescan.cli_commands()


# ----------------------------------------------------------------------------------------------------- code blocks


def run_blocks(blocks, namespace: dict) -> list[str]:
    """Run a page's blocks in order in ``namespace``; ``file:line: what failed`` for each failure."""
    failures = []
    for block in blocks:
        where = f"{block.path}:{block.line}"
        if block.lang == "pycon":
            test = doctest.DocTestParser().get_doctest(block.code, namespace, where, block.path, block.line)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            report: list[str] = []
            runner.run(test, out=report.append, clear_globs=False)
            if runner.failures:
                failures.append(f"{where}: doctest failed\n" + "".join(report))
        else:
            try:
                exec(compile(block.code, where, "exec"), namespace)
            except Exception as err:  # noqa: BLE001 - reported with the block's place
                failures.append(f"{where}: {type(err).__name__}: {err}")
    return failures


@pytest.fixture
def smoke_models(monkeypatch):
    """``load_model`` of the embedded default returns the tiny random model and tokenizer (the notebooks' smoke
    mode)."""
    import relaylens
    import relaylens.model.loading
    from relaylens.testing import tiny_model, tiny_tokenizer

    def load_model(spec="smollm2-135m-instruct", **kwargs):
        return tiny_model("llama"), tiny_tokenizer()

    monkeypatch.setattr(relaylens, "load_model", load_model, raising=False)
    monkeypatch.setattr(relaylens.model.loading, "load_model", load_model)
    monkeypatch.setenv("RELAYLENS_SMOKE", "1")


EXECUTED = [p for p in PAGES if any(b.lang in RUNNABLE and not b.skip for b in codescan.code_blocks(p, ROOT))]


@pytest.mark.parametrize("page", EXECUTED, ids=_id)
def test_python_blocks_run(page, smoke_models, tmp_path, monkeypatch):
    import types

    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("relaylens_docs_page")  # a real module: dataclasses defined in a block look it up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    blocks = [b for b in codescan.code_blocks(page, ROOT) if b.lang in RUNNABLE and not b.skip]
    failures = run_blocks(blocks, module.__dict__)
    assert not failures, "\n".join(failures)


def test_block_runner_reports_a_broken_example():
    good = codescan.Block("x.md", 1, "pycon", ">>> 1 + 1\n2", None)
    wrong = codescan.Block("x.md", 5, "pycon", ">>> 1 + 1\n3", None)
    raises = codescan.Block("x.md", 9, "python", "from relaylens import no_such_name", None)
    assert run_blocks([good], {}) == []
    failures = run_blocks([wrong, raises], {})
    assert failures[0].startswith("x.md:5: doctest failed") and failures[1].startswith("x.md:9: ImportError")


def test_every_skipped_block_says_why():
    skipped = [b for p in PAGES for b in codescan.code_blocks(p, ROOT) if b.skip is not None]
    assert all(b.skip != "no reason given" for b in skipped), [f"{b.path}:{b.line}" for b in skipped]


# ------------------------------------------------------------------------------------------------ command lines


def cli_problems(page: Path, commands, root: Path = ROOT) -> list[str]:
    problems = []
    for block in codescan.code_blocks(page, root):
        if block.lang in SHELL:
            for line in codescan.shell_commands(block.code):
                problems += [f"{block.path}:{block.line}: {p}" for p in codescan.check_cli_line(line, commands)]
    for number, command in codescan.inline_commands(page):
        problems += [f"{page.name}:{number}: {p}" for p in codescan.check_cli_line(command, commands)]
    return problems


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_command_lines_use_existing_commands_and_options(page, commands):
    problems = cli_problems(page, commands)
    assert not problems, "\n".join(problems)


def test_cli_check_catches_an_option_the_app_does_not_have(commands, tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `relaylens figures RUN --only figure6 --colour blue`.\n\n"
                    "```bash\nrelaylens run main_table \\\n"
                    "    --limit 2 --no-such-flag\nrelaylens modle pull\nrelaylens model pul\n```\n")
    problems = cli_problems(page, commands, root=tmp_path)
    assert any("`relaylens figures` has no option --colour" in p for p in problems), problems
    assert any("`relaylens run` has no option --no-such-flag" in p for p in problems), problems
    assert any("relaylens model pul" in p and "no such command" in p for p in problems), problems
    assert not codescan.check_cli_line("relaylens run ANALYSIS [--model SPEC] [--limit N] --preset paper", commands)
    assert not codescan.check_cli_line("relaylens bench all  # --comment is fine", commands)
    # an install line names the package (and its extras), not the command; a command after it is still checked
    assert not codescan.check_cli_line("pip install 'relaylens[kvpress]'   # extras", commands)
    assert not codescan.check_cli_line(".venv/bin/pip install -e '.[dev]'", commands)
    assert codescan.check_cli_line("pip3 list && relaylens modle pull", commands)


# -------------------------------------------------------------------------------------------------- named paths


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_named_repository_paths_exist(page):
    text = page.read_text(encoding="utf-8")
    missing = []
    for path in sorted(set(PATH.findall(text))):
        clean = re.sub(r"<[^>]*>.*$", "", path).rstrip("/")  # RUN_DIR/<hash>... placeholders: check the prefix
        if not clean or "NAME" in clean or "ANALYSIS" in clean:
            continue
        if not (list(ROOT.glob(clean)) if "*" in clean else (ROOT / clean).exists()):
            missing.append(path)
    assert not missing, f"{_id(page)} names paths that do not exist: {missing}"


# ------------------------------------------------------------------------- generated pages: inputs stay complete


def test_every_environment_variable_read_is_described_and_vice_versa():
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    import generate

    read = {r.name for r in codescan.env_reads(ROOT)}
    described = set(generate.env_descriptions())
    assert read - described == set(), f"read in the code but not in docs/reference/environment.yml: {read - described}"
    assert described - read == set(), f"described but never read: {described - read}"


def test_env_scan_finds_each_way_of_reading_a_variable(tmp_path, monkeypatch):
    pkg = tmp_path / "relaylens"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "import os\nNAME = 'RELAYLENS_VIA_CONSTANT'\n"
        "a = os.environ.get('RELAYLENS_A')\nb = os.environ['RELAYLENS_B']\nc = os.getenv('RELAYLENS_C')\n"
        "d = 'RELAYLENS_D' in os.environ\ne = os.environ.get(NAME)\n"
        "def f(env):\n    return env['SLURM_X'], _int(env, 'SLURM_Y'), 'not_an_env' in env\n"
        "label = 'RELAYLENS_NOT_READ'\n")
    found = {r.name for r in codescan.env_reads(tmp_path)}
    assert found == {"RELAYLENS_VIA_CONSTANT", "RELAYLENS_A", "RELAYLENS_B", "RELAYLENS_C", "RELAYLENS_D",
                     "SLURM_X", "SLURM_Y"}


def test_the_figure_table_lists_every_built_in_figure_in_its_columns():
    assert codescan.figure_table_problems() == []


def test_the_figure_table_check_catches_each_kind_of_drift():
    import relaylens.reporting.figures as figures

    entries = {"table1": ("table", "main_table"), "figure4": ("figure", "coordinate_ablation")}
    rule = "======= ====== =================== ====="

    def table(*rows: str) -> str:
        return "\n".join([rule, "name    kind   file                what", rule, *rows, rule]) + "\n"

    table1 = "table1  table  main_table          accuracy"
    more = "                                    per selector"
    figure4 = "figure4 figure coordinate_ablation means"
    check = codescan.figure_table_problems
    assert check(table(table1, more, figure4), entries) == []
    assert "runs over its column" in check(table(table1, "figure4x figure coordinate_ablation x"), entries)[0]
    assert "fills the kind or file column" in check(table(table1, "        table", figure4), entries)[0]
    assert check(table(table1, figure4, "table9  table  main_table          x"), entries) == [
        codescan.FIGURE_TABLE_HOME + ": the figure table lists 'table9', which is not registered"]
    assert "'figure4' (figure, coordinate_ablation) has no row" in check(table(table1), entries)[0]
    assert check(table(table1.replace("main_table", "overhead  "), figure4), entries) == [
        codescan.FIGURE_TABLE_HOME + ": the figure table gives 'table1' kind and file ('table', 'overhead'); the "
        "registry has ('table', 'main_table')"]
    reflowed = " ".join(figures.__doc__.split())  # what a reflow did to it (issue 53)
    assert "three equal rule lines" in check(reflowed, entries)[0]


def test_every_public_name_has_a_docstring():
    import generate

    problems = generate.missing_docstrings(generate.load_package())
    assert not problems, "\n".join(problems)


def test_readme_is_short_and_shares_its_quickstart_with_the_site():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme) <= 10_000, f"README.md has {len(readme)} characters; move detail into docs/ (limit 10,000)"
    assert "--8<-- [start:quickstart]" in readme and "--8<-- [end:quickstart]" in readme
    assert '--8<-- "README.md:quickstart"' in (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    for command in ("make demo", "make test"):
        assert command in readme
