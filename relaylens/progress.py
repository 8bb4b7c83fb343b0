"""The progress view of long work — runs, sweeps and request benchmarks share one look.

Columns: the task's description, a bar, ``done/total``, the task's ``stage`` field (what runs now), the elapsed time
and, unless ``remaining=False``, the estimated time left.

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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[stage]}"),
               TimeElapsedColumn()]
    if remaining:
        columns.append(TimeRemainingColumn())
    return Progress(*columns, console=console, transient=False)
