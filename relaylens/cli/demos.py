"""``relaylens demo``: three analyses on the bundled sample, with figures and HTML reports."""

from __future__ import annotations

from pathlib import Path

import typer

from relaylens.cli.common import console, guard
from relaylens.model.catalogue import DEFAULT_MODEL  # a name only: importing it loads no model code


def demo(
    limit: int = typer.Option(12, help="records of the bundled sample per analysis"),
    out: Path = typer.Option(Path("runs/demo"), help="directory for the three run directories"),
    model: str = typer.Option(DEFAULT_MODEL, help="model spec (embedded name, local dir, .gguf, hub id)"),
    data: str = typer.Option("sample", help="dataset file or 'sample'"),
    dtype: str = typer.Option(None, help="model dtype: float32 (default on a CPU), bfloat16, or auto (the one "
                              "measured faster on this machine)"),
) -> None:
    """evidence_reading, coordinate_ablation and ordering on the bundled sample, with figures and HTML reports."""
    from relaylens.experiments.demo import run_demo  # noqa: PLC0415 - CLI startup

    guard(run_demo, out=out, limit=limit, model=model, data=data, console=console, dtype=dtype)
