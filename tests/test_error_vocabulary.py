"""One error vocabulary (issue 53, item 3): every error relaylens raises on purpose is a
:class:`~relaylens.errors.RelaylensError`, and the command line treats everything else as the bug it is.

* Every ``raise ValueError / TypeError / RuntimeError / NotImplementedError / Exception`` in the package (found with
  ``ast``, file by file) must be listed in :data:`ALLOWED_RAISES` under its ``(file, function)`` with the reason it is
  not a RelaylensError: an internal invariant (a bug if it ever fires), an abstract method, a protocol a caller or a
  third-party library expects.
* Every exception class the package defines must derive from RelaylensError, unless :data:`ALLOWED_CLASSES` says why
  not (an ``OSError`` of a failed write, a private signal that never leaves its module).
* Both lists are exact: an entry whose raise or class is gone fails too, so the lists never go stale.
* ``guard`` (relaylens.cli.common): a RelaylensError is one ``error:`` line with exit status 2; a plain ``ValueError``
  (or any other exception) prints one ``relaylens: internal error`` line and propagates with its traceback.
"""

from __future__ import annotations

import ast
import builtins
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relaylens.errors import RelaylensError

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "relaylens"
BASE = "relaylens.errors.RelaylensError"
BUILTIN_RAISES = {"ValueError", "TypeError", "RuntimeError", "NotImplementedError", "Exception", "BaseException"}

#: (file relative to the repository, function qualname) -> why this builtin raise is not a RelaylensError
ALLOWED_RAISES: dict[tuple[str, str], str] = {
    ("relaylens/bench/dtype.py", "run_arm_process"):
        "a measurement subprocess exited non-zero; the error carries the child's stderr (its traceback): a failed "
        "run, not bad input",
    ("relaylens/conditions/catalogue.py", "Condition.coordinates"):
        "abstract method: every condition class overrides it",
    ("relaylens/selectors/base.py", "Selector.select"):
        "abstract method: every selector overrides it",
    ("relaylens/datasets/synthetic.py", "_check"):
        "generator invariant (the evidence alone answers the question, no banned near-miss word): a generator bug",
    ("relaylens/datasets/synthetic_kinds.py", "resolve"):
        "unreachable: query ops come from the generator's own plans",
    ("relaylens/generation/attention.py", "window_allow"):
        "internal invariant: the positions recorded by the attention state match the keys the model holds",
    ("relaylens/generation/attention.py", "relaylens_attention"):
        "the 'relaylens' attention kernel called outside attention_context(): a programming error (relaylens always "
        "enters the context), raised from inside the model's forward",
    ("relaylens/model/packed.py", "_packed_forward.forward"):
        "a packed layer called outside the state packed_linears set up (gradients on, another dtype): a usage error "
        "inside the model's forward, a RuntimeError like torch's own state errors (tests/model/test_packed.py)",
    ("relaylens/integrations/lm_eval.py", "RelaylensLM.loglikelihood_rolling"):
        "lm_eval's LM interface: an unsupported request type raises NotImplementedError, as lm_eval expects",
    ("relaylens/results/manifest.py", "json_default"):
        "json.dumps's default= hook must raise TypeError for an unserialisable object; canonical_manifest rewords it "
        "as a ResultStoreError",
    ("relaylens/results/store.py", "_check_value"):
        "private signal: _columns catches the TypeError at once and raises a ResultStoreError naming the column",
}

#: fully qualified class -> why it does not derive from RelaylensError
ALLOWED_CLASSES: dict[str, str] = {
    "relaylens.fileio.OutputWriteError":
        "an OSError (disk full, permissions) of a failed write: `except OSError` handlers and the CLI's OS-error line "
        "(errno-specific fix, exit 2) treat it as one; as a ValueError too, input-error handlers would swallow it",
    "relaylens.results.store.StoreWriteError":
        "an OSError of a failed run-directory write, for the same reasons as OutputWriteError",
    "relaylens.integrations.kvpress_relay.RelayPressError":
        "the press module is self-contained (it runs in kvpress's own environment, or copied alone) and imports no "
        "other relaylens module, so it cannot import RelaylensError (tests/integrations/test_kvpress_relay.py); a "
        "ValueError, as RelaylensError is, and never raised under the command line",
    "relaylens.datasets.haystack._Underfilled":
        "private control-flow signal carrying the tokens reached; build_haystacks catches it at once (a RecordError "
        "or a recorded skip)",
    "relaylens.results.store._Mismatch":
        "private signal; load_run / _exported_tables catch it at once (a warning and a rebuild, or a "
        "ResultStoreError)",
}


# ------------------------------------------------------------------------------------------------ walking the package


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text("utf-8"), str(path))) for path in sorted(PACKAGE.rglob("*.py"))]


def _builtin_raises() -> dict[tuple[str, str], list[int]]:
    """``{(file, function qualname): [line, ...]}`` of every raise of a builtin exception in the package."""
    found: dict[tuple[str, str], list[int]] = {}
    for path, tree in _sources():
        rel = path.relative_to(ROOT).as_posix()

        def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(child, (*scope, child.name))
                    continue
                if isinstance(child, ast.Raise) and child.exc is not None:
                    target = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                    if isinstance(target, ast.Name) and target.id in BUILTIN_RAISES:
                        found.setdefault((rel, ".".join(scope) or "<module>"), []).append(child.lineno)
                visit(child, scope)

        visit(tree, ())
    return found


def _exception_classes() -> dict[str, bool]:
    """``{qualified class: derives from RelaylensError}`` for every class of the package that derives from
    BaseException, its bases resolved through the module's own classes, its imports (relative ones included) and the
    builtins; a base from another library is asked where it is imported, else told by its name."""
    bases: dict[str, list[str]] = {}
    for path, tree in _sources():
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(anchor + ([source] if source else []))
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:  # ``import a.b`` binds ``a``; ``import a.b as c`` binds ``a.b``
                    names[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                        alias.name.split(".")[0]
            elif isinstance(node, ast.ClassDef):
                names[node.name] = f"{module}.{node.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                resolved = []
                for base in node.bases:
                    text = ast.unparse(base)
                    head, _, rest = text.partition(".")
                    if head in names:
                        resolved.append(names[head] + (f".{rest}" if rest else ""))
                    elif hasattr(builtins, head) and not rest:
                        resolved.append(f"builtins.{head}")
                    else:
                        resolved.append(text)
                bases[f"{module}.{node.name}"] = resolved

    def outside(name: str) -> tuple[bool, bool]:
        """A base from the builtins or another library: asked where its module is imported already (importing
        torch or kvpress here would cost seconds), else told by its name."""
        module, _, attr = name.rpartition(".")
        cls = getattr(sys.modules.get(module), attr, None)
        if isinstance(cls, type):
            return issubclass(cls, BaseException), issubclass(cls, RelaylensError)
        return attr.endswith(("Error", "Exception", "Exit", "Abort", "Interrupt", "Warning")), False

    def kind(name: str, seen: frozenset = frozenset()) -> tuple[bool, bool]:
        """(is an exception, derives from RelaylensError)"""
        if name == BASE:
            return True, True
        if name in bases and name not in seen:
            found = [kind(b, seen | {name}) for b in bases[name]]
            return any(e for e, _ in found), any(r for _, r in found)
        return outside(name)

    return {name: kind(name)[1] for name in bases if name != BASE and kind(name)[0]}


# ---------------------------------------------------------------------------------------------------- the package


def test_every_builtin_raise_is_allowed_with_a_reason():
    found = _builtin_raises()
    unlisted = {f"{path}:{lines} in {function}" for (path, function), lines in found.items()
                if (path, function) not in ALLOWED_RAISES}
    assert not unlisted, ("raise a RelaylensError (or its fitting subclass: RecordError, ShapeError, PositionError, "
                          "BudgetError, ModelError, ...) with a message that says what was expected, what arrived "
                          "and the fix; or, for an internal invariant, list it in ALLOWED_RAISES with the reason: "
                          f"{sorted(unlisted)}")
    stale = set(ALLOWED_RAISES) - set(found)
    assert not stale, f"ALLOWED_RAISES lists raises that are gone: {sorted(stale)}"
    assert all(reason.strip() for reason in ALLOWED_RAISES.values())


def test_every_exception_class_is_a_relaylens_error_or_allowed():
    classes = _exception_classes()
    outside = {name for name, ok in classes.items() if not ok and name not in ALLOWED_CLASSES}
    assert not outside, (f"exception classes that do not derive from {BASE}: {sorted(outside)}. Fix: derive them "
                         "from RelaylensError (or one of its subclasses in relaylens/errors.py), keeping a second "
                         "base where callers rely on it; or list them in ALLOWED_CLASSES with the reason")
    stale = {name for name in ALLOWED_CLASSES if classes.get(name) is not False}
    assert not stale, f"ALLOWED_CLASSES lists classes that are gone or now RelaylensErrors: {sorted(stale)}"
    # the walk sees the classes it must: the vocabulary, a class with two bases, one from a subpackage's own module
    for name in ("relaylens.errors.RecordError", "relaylens.model.pull.PullError",
                 "relaylens.scoring.transport.DeadlinePassed", "relaylens.results.manifest.ResultStoreError"):
        assert classes.get(name) is True, name


def test_classes_that_joined_the_vocabulary_keep_their_old_base():
    from relaylens.model.pull import PullError
    from relaylens.scoring.transport import DeadlinePassed, ReplyTooLarge

    assert issubclass(PullError, RelaylensError) and issubclass(PullError, RuntimeError) and PullError.multiline
    assert issubclass(DeadlinePassed, RelaylensError) and issubclass(ReplyTooLarge, RelaylensError)
    assert issubclass(RelaylensError, ValueError)


# ---------------------------------------------------------------------------------------------- the command line


@pytest.fixture
def synth(monkeypatch):
    """``relaylens data synth`` with its work (``synth_command``, run through ``guard``) replaced by ``raising``."""
    import relaylens.cli.data as data

    def run(exc: BaseException, tmp_path: Path):
        def boom(*args, **kwargs):
            raise exc

        monkeypatch.setattr(data, "synth_command", boom)
        from relaylens.cli import app

        return CliRunner().invoke(app, ["data", "synth", "--n", "1", "--out", str(tmp_path / "s.json")])

    return run


@pytest.mark.parametrize("exc", [ValueError("invalid literal for int() with base 10: 'x'"), TypeError("unhashable"),
                                 KeyError("question_id")])
def test_a_plain_exception_in_a_command_is_an_internal_error(synth, tmp_path, exc):
    result = synth(exc, tmp_path)
    assert result.exception is exc and result.exit_code == 1  # it propagates: its traceback is the report
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [f"relaylens: internal error ({type(exc).__name__}); this is a bug: please report it to the "
                     "relaylens maintainers with the command and the traceback below"], result.output
    assert "error:" not in result.output.replace("internal error", "")


def test_a_relaylens_error_in_a_command_is_one_error_line_with_exit_2(synth, tmp_path):
    result = synth(RelaylensError("history_tokens=3 is too small. Fix: ask for more"), tmp_path)
    assert result.exit_code == 2 and "internal error" not in result.output
    assert [line for line in result.output.splitlines() if line.strip()] == [
        "error: history_tokens=3 is too small. Fix: ask for more"]


def test_a_guard_inside_a_guard_reports_an_internal_error_once(capsys):
    from relaylens.cli.common import guard

    def bad():
        raise ValueError("internal")

    with pytest.raises(ValueError, match="internal"):
        guard(guard, bad)
    assert capsys.readouterr().err.count("relaylens: internal error (ValueError)") == 1


def test_an_internal_error_prints_its_line_then_the_traceback(tmp_path):
    """The real command line (a fresh interpreter): the line, then Python's traceback naming the exception, exit 1."""
    script = textwrap.dedent(f"""
        import sys
        import relaylens.cli.data as data

        def boom(*args, **kwargs):
            raise ValueError("boom from inside")

        data.synth_command = boom
        from relaylens.cli import app
        sys.argv = ["relaylens", "data", "synth", "--n", "1", "--out", {str(tmp_path / "s.json")!r}]
        app(prog_name="relaylens")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    line = done.stderr.find("relaylens: internal error (ValueError); this is a bug")
    trace = done.stderr.find("Traceback")
    assert 0 <= line < trace, done.stderr
    assert "boom from inside" in done.stderr[trace:] and "error: boom" not in done.stderr
