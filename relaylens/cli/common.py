"""What every command group of the command line shares: the typer apps, the console, the placement options, and the
guards that turn bad input into one clear line with exit status 2 (never a traceback from deep inside torch).

Bad input is what relaylens raises on purpose: a :class:`~relaylens.errors.RelaylensError` (and operating-system
errors on the files a command names). Any other exception -- a bare ``ValueError`` or ``TypeError`` from deep
inside included -- is a bug: :func:`guard` prints one ``relaylens: internal error (TYPE); this is a bug`` line and lets
it propagate, so its traceback follows and the exit status is 1.

Example:
    >>> os_error_line(FileNotFoundError(2, "No such file or directory", "runs/x"))
    'No such file or directory (runs/x). Fix: check the path'
"""

from __future__ import annotations

import contextlib
import errno
import os
import warnings

import click
import typer
from rich.console import Console
from rich.markup import escape

from relaylens.errors import RelaylensError, shown

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="relaylens: post-selection positional geometry of sparse KV caches.")
model_app = typer.Typer(no_args_is_help=True, help="Embedded models.")
data_app = typer.Typer(no_args_is_help=True, help="Datasets.")
app.add_typer(model_app, name="model")
app.add_typer(data_app, name="data")
console = Console(stderr=True, soft_wrap=True)  # one clear line per error, never wrapped mid-message

#: where an internal error is to be reported (pyproject.toml names no issue tracker or contact address)
REPORT_TO = "please report it to the relaylens maintainers with the command and the traceback below"
#: the command line's own exits and click's usage errors: they pass :func:`guard` untouched
_CLI_EXITS = (typer.Exit, typer.Abort, click.exceptions.Exit, click.exceptions.Abort, click.ClickException)

# --- the placement options of every command that loads a model -----------------------------------------------------

DEVICE = typer.Option(None, "--device", help="cpu, cuda, cuda:N, mps or auto (auto: cuda:LOCAL_RANK, mps, cpu); "
                      "default cpu")
DTYPE = typer.Option(None, "--dtype", help="float32, bfloat16, float16 or auto (auto: bfloat16 where the device runs "
                     "it natively -- CUDA, CPUs with AMX-BF16 or AVX512-BF16 -- else float32; default: float32 on "
                     "CPU, bfloat16 on CUDA)")
DEVICE_MAP = typer.Option(None, "--device-map", help="accelerate device map (auto) for models that do not fit one "
                          "device")
ATTN = typer.Option("sdpa", "--attn-implementation", help="prefill attention kernel: sdpa, eager, flash_attention_2 "
                    "(where installed)")
ROPE = typer.Option(None, "--rope-scaling", help="rotary override before loading: yarn:FACTOR[:ORIGINAL_MAX], "
                    "linear:FACTOR, llama3:FACTOR:LOW:HIGH:ORIGINAL_MAX (or TYPE:key=value,...)")
MAX_POS = typer.Option(None, "--max-position", help="override max_position_embeddings (e.g. 131072 with yarn:4:32768)")


def load_kwargs(device, dtype, device_map, attn_implementation, rope_scaling, max_position) -> dict:
    """Resolved :func:`relaylens.model.loading.load_model` placement options (one clear line on bad values)."""
    from relaylens.model.placement import Placement  # noqa: PLC0415 - CLI startup: importing the command line loads no model code

    return guard(Placement.resolve, device, dtype, device_map, attn_implementation, rope_scaling,
                 max_position).load_kwargs()


# --- one clear line per error ----------------------------------------------------------------------------------------

def fail(message: str, multiline: bool = False) -> None:
    """Print ``error: message`` and exit 2: one line, even when it quotes a record id; an error whose class says its
    line breaks are its own (``multiline``, e.g. a pull's pip output) prints them as lines, each line escaped."""
    lines = str(message).split("\n") if multiline else [message]
    console.print("[bold red]error:[/] " + "\n".join(safe(line) for line in lines))
    raise typer.Exit(2)


def safe(text) -> str:
    """Text for ``console.print``: control characters shown as escapes (:func:`relaylens.errors.shown`) and rich
    markup escaped (messages may hold brackets: pip install 'relaylens[ray]')."""
    return escape(shown(text))


@contextlib.contextmanager
def warnings_as_lines():
    """Python warnings raised inside print at once as one ``warning:`` line each, without a source path."""
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *args, **kwargs: console.print(
            f"[bold yellow]warning:[/] {safe(message)}")
        yield


def check_key_env(judge_url: str | None, judge_key_env: str | None) -> None:
    """An unset ``--judge-key-env`` variable, in the command line's terms (before any model loads)."""
    if judge_url and judge_key_env is not None and not os.environ.get(judge_key_env):
        fail(f"--judge-key-env {judge_key_env}: the environment variable {judge_key_env} is not set (or empty). Fix: "
             f"export {judge_key_env}=YOUR_KEY before the command, or leave out --judge-key-env for an endpoint "
             "without authentication")


def internal_error_line(err: BaseException) -> str:
    """The one line printed before an exception that is not bad input propagates (its traceback follows).

    >>> internal_error_line(KeyError("x"))
    'relaylens: internal error (KeyError); this is a bug: please report it to the relaylens maintainers with the command and the traceback below'
    """  # noqa: E501 - doctest: the line is matched whole
    return f"relaylens: internal error ({type(err).__name__}); this is a bug: {REPORT_TO}"


def guard(fn, *args, **kwargs):
    """Run ``fn`` and turn relaylens input errors (:class:`~relaylens.errors.RelaylensError`) and OS errors into one
    clear line (exit 2), and its Python warnings into one ``warning:`` line each. Any other exception (a bare
    ``ValueError`` included) is a bug: one :func:`internal_error_line` on stderr, then it propagates with its
    traceback."""
    from relaylens.results.store import StoreWriteError  # noqa: PLC0415 - CLI startup: the store imports pandas, which most commands skip

    try:
        with warnings_as_lines():
            return fn(*args, **kwargs)
    except RelaylensError as err:
        fail(str(err), getattr(err, "multiline", False))
    except StoreWriteError as err:  # already names the run directory and the fix
        fail(str(err))
    except OSError as err:
        fail(os_error_line(err))
    except RecursionError:
        fail("the input is nested too deeply to read (RecursionError). Fix: check that the file is what the "
             "command expects")
    except _CLI_EXITS:
        raise
    except Exception as err:
        if not getattr(err, "_relaylens_reported", False):  # a guard inside a guard: one line
            console.print(f"[bold red]{safe(internal_error_line(err))}[/]")
            with contextlib.suppress(AttributeError, TypeError):
                err._relaylens_reported = True
        raise


def warned(fn, *args, **kwargs):
    """:func:`guard` ``fn``, printing each warning it raises as one ``warning:`` line (stderr) before its result
    or error."""

    def call():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return fn(*args, **kwargs)
            finally:
                for w in caught:
                    if not issubclass(w.category, DeprecationWarning):
                        console.print(f"[bold yellow]warning:[/] {escape(str(w.message))}")

    return guard(call)


def os_error_line(err: OSError) -> str:
    """One line for an operating-system error: what failed on which file, and a fix that fits the error
    (only a full disk is told to free space)."""
    what = err.strerror or str(err) or type(err).__name__
    if "Fix:" in what:  # relaylens's own OSErrors (StoreWriteError, OutputWriteError) already name the file and fix
        return what
    where = " -> ".join(str(f) for f in (err.filename, getattr(err, "filename2", None)) if f)
    if err.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        fix = "free space (or raise the file-size limit) or choose another output directory (--out)"
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "check the permissions, or choose another directory"
    elif isinstance(err, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        fix = "check the path"
    else:
        fix = "check the path, the network (for hub models) and the disk"
    if not where and str(err) and not err.strerror:  # messages that already say everything (FileNotFoundError("..."))
        return f"{err}" if "Fix" in str(err) else f"{err}. Fix: {fix}"
    return f"{what}{f' ({where})' if where else ''}. Fix: {fix}"


def print_summary(run_dir) -> None:
    """The accuracy table, evidence retention and skipped records of a finished run (stdout)."""
    from relaylens.experiments.summary import run_summary  # noqa: PLC0415 - CLI startup: summaries read pandas tables

    text = run_summary(run_dir)
    if text:
        print(text)
