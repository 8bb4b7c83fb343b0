"""The command line: ``relaylens run | sweep | merge | judge | figures | report | bench | demo | data synth | pull |
haystack | model pull``, the typer app ``relaylens.cli:app`` (``python -m relaylens.cli`` runs it too).

Every command prints where its output went; long work shows a rich progress bar. Errors from relaylens (bad input,
a :class:`~relaylens.errors.RelaylensError`) are printed as one clear line with exit status 2, never as a traceback
from deep inside torch; any other exception is a bug, announced by one ``relaylens: internal error`` line before its
traceback (exit status 1).

Owns one module per command group: :mod:`~relaylens.cli.common` (the apps, the console, placement options and the
error guards), :mod:`~relaylens.cli.options` (the options of ``run`` and ``sweep``, and each analysis's own flags,
read from its record), :mod:`~relaylens.cli.runs` (``run``, ``sweep``, ``merge``), :mod:`~relaylens.cli.judge`,
:mod:`~relaylens.cli.reporting` (``figures``, ``report``), :mod:`~relaylens.cli.benchmarks` (``bench``, each
benchmark told its options by :data:`relaylens.bench.registry.BENCHMARKS`), :mod:`~relaylens.cli.demos`,
:mod:`~relaylens.cli.model` (``model pull | check``) and :mod:`~relaylens.cli.data` (``data synth | pull |
haystack``: synthetic records, the real benchmark files, S-like haystacks from the LongMemEval oracle); this face
registers every command, in the order ``relaylens --help`` lists them.

A documented wall: importing the command line loads no model code (torch, transformers) and no pandas; the commands
import what they run inside their bodies, so ``relaylens --help`` and the table-only commands start fast.

May import: errors, progress, datasets, model, geometry, conditions, selectors, generation, probes, scoring, results,
reporting, experiments, bench (the top floor: every room).
"""

from relaylens.cli.benchmarks import bench
from relaylens.cli.common import app, console, data_app, model_app, os_error_line
from relaylens.cli.data import data_haystack, data_pull, data_synth
from relaylens.cli.demos import demo
from relaylens.cli.judge import judge_command
from relaylens.cli.model import model_check, model_pull
from relaylens.cli.options import RUN_OPTIONS, RunCommand, with_run_options
from relaylens.cli.reporting import figures_command, report_command
from relaylens.cli.runs import merge, run, sweep

__all__ = ["RUN_OPTIONS", "app", "bench", "console", "data_app", "data_synth", "demo", "figures_command",
           "judge_command", "main", "merge", "model_app", "model_check", "model_pull", "os_error_line",
           "report_command", "run", "sweep", "with_run_options"]

model_app.command("pull")(model_pull)
model_app.command("check")(model_check)
data_app.command("synth")(data_synth)
data_app.command("pull")(data_pull)
data_app.command("haystack")(data_haystack)
app.command("bench")(bench)
app.command("run", cls=RunCommand)(run)
app.command("sweep", cls=RunCommand)(sweep)
app.command("merge")(merge)
app.command("judge")(judge_command)
app.command("figures")(figures_command)
app.command("report")(report_command)
app.command("demo")(demo)


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="relaylens")
