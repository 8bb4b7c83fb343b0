"""The progress view of long work — runs, sweeps and request benchmarks share one look.

Columns: the task's description, a bar, ``done/total``, the task's ``stage`` field (what runs now; plain text, never
rich markup: callers pass dataset strings through :func:`relaylens.errors.shown`), the elapsed time and, unless
``remaining=False``, the estimated time left.

Example:
    >>> view = progress_view()
    >>> task = view.add_task("records", total=3, stage="prefill")
    >>> view.update(task, advance=1, stage="decode")
    >>> view.tasks[0].completed, view.tasks[0].fields["stage"]
    (1, 'decode')
"""

from __future__ import annotations


def progress_view(console=None, remaining: bool = True):
    """A ``rich.progress.Progress`` with relaylens's columns (on ``console``; None: rich's default, stdout)."""
    from rich.progress import (  # noqa: PLC0415 - import cost: rich loads on first use
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    # the stage may quote a record id: printed as plain text, never read as rich markup ([link=...] would be a link)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[stage]}", markup=False), TimeElapsedColumn()]
    if remaining:
        columns.append(TimeRemainingColumn())
    return Progress(*columns, console=console, transient=False)
