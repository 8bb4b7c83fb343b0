"""``relaylens data synth``: seeded LongMemEval-schema records."""

from __future__ import annotations

from pathlib import Path

import typer

from relaylens.cli.common import console, fail, guard
from relaylens.datasets.synthetic import synth_command


def data_synth(
    n: int = typer.Option(24, "--n", help="number of records"),
    seed: int = typer.Option(0, help="random seed"),
    history_tokens: int = typer.Option(2048, "--history-tokens", help="target history length in model tokens"),
    tokenizer: str = typer.Option(None, help="model whose tokenizer counts tokens (default: approximate counter)"),
    out: Path = typer.Option(Path("synthetic_longmemeval.json"), help="output JSON file"),
) -> None:
    """Write seeded LongMemEval-schema records (all seven question kinds)."""
    if n < 1:
        fail(f"--n must be a positive number of records; got {n}. Fix: pass --n 1 or more")
    if history_tokens < 1:
        fail(f"--history-tokens must be positive; got {history_tokens}")
    tok = None
    if tokenizer:
        from relaylens.model.loading import load_tokenizer  # noqa: PLC0415 - CLI startup

        tok = guard(load_tokenizer, tokenizer)
    path = guard(synth_command, n, seed, history_tokens, tok, out)
    console.print(f"[green]wrote[/] {n} records to {path}")
