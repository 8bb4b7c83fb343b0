"""``relaylens judge RUN_DIR``: re-score a finished run's answers with another judge."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import typer

from relaylens.cli.common import check_key_env, console, fail, guard, safe
from relaylens.errors import shown
from relaylens.progress import progress_view
from relaylens.scoring import longmemeval_judge as lme
from relaylens.scoring.judge import (  # the judge's documented bounds (stdlib only)
    DEADLINE_S,
    MAX_NEW_TOKENS,
    MAX_REPLY_BYTES,
    HFBackend,
    OpenAIBackend,
    check_judge_url,
)


def judge_command(
    run_dir: Path = typer.Argument(..., help="a finished run directory"),
    judge_url: str = typer.Option(None, "--judge-url", help="OpenAI-compatible base URL of the judge"),
    judge_model: str = typer.Option(..., "--judge-model", help="judge model: name at --judge-url, or a local HF "
                                    "model spec"),
    judge_key_env: str = typer.Option(None, "--judge-key-env", help="environment variable with the judge's API key"),
    max_tokens: int = typer.Option(None, "--max-tokens", help="judge output tokens (default: the template's, 32 or "
                                   "10; the paper's second judge: 2048)"),
    judge_template: str = typer.Option("memory_judge_v1", "--judge-template", help="memory_judge_v1 (scores "
                                       "judge_NAME) or longmemeval (LongMemEval's own prompts; scores judge_lme_NAME)"),
    reasoning_effort: str = typer.Option(None, "--reasoning-effort", help="low, medium or high (reasoning judges)"),
    name: str = typer.Option(None, "--name", help="judge name: scores become judge_NAME (default: from the model)"),
    data: str = typer.Option(None, help="the run's dataset file, when it moved since the run"),
    deadline: float = typer.Option(DEADLINE_S, "--deadline", help="wall-clock seconds one judge call may take, "
                                   "retries included (a server trickling bytes is cut there)"),
    max_reply_bytes: int = typer.Option(MAX_REPLY_BYTES, "--max-reply-bytes", help="largest judge reply read"),
    dtype: str = typer.Option(None, "--dtype", help="a local judge's dtype: float32 (default), bfloat16 "
                              "(faster on CPUs with AMX), float16 or auto; not for --judge-url"),
) -> None:
    """Re-score a finished run's answers with another judge (generations untouched; adds judge_NAME scores)."""
    from relaylens.experiments.rejudge import check_judge_name, check_template_records, judge_name, rejudge_run  # noqa: PLC0415 - CLI startup

    if judge_url:  # a space or control character in the URL: one redacted line before anything else
        guard(check_judge_url, judge_url, [os.environ.get(judge_key_env or "")])
    name = guard(judge_name, judge_model) if name is None else name
    guard(check_judge_name, name)
    name = guard(lme.pass_name, judge_template, name)  # lme_NAME; an unknown template or a reserved name: refused
    if judge_template == lme.TEMPLATE:  # LongMemEval's prompts on other records: refused before the model loads
        guard(check_template_records, run_dir, judge_template, data)
    if max_tokens is None:
        max_tokens = lme.MAX_NEW_TOKENS if judge_template == lme.TEMPLATE else MAX_NEW_TOKENS
    check_key_env(judge_url, judge_key_env)
    if judge_url and dtype:
        fail(f"--dtype {dtype!r} sets a local judge's weights; a judge at --judge-url runs in its server's own "
             "dtype. Fix: drop --dtype, or drop --judge-url to judge with a local model")
    products = contextlib.nullcontext()
    if judge_url:
        backend = guard(OpenAIBackend, judge_url, judge_model, api_key_env=judge_key_env, max_tokens=max_tokens,
                        reasoning_effort=reasoning_effort, deadline=deadline, max_reply_bytes=max_reply_bytes)
    else:
        from relaylens.model.loading import load_model  # noqa: PLC0415 - late binding (tests swap loading.load_model); CLI startup
        from relaylens.model.upcast import float32_products, model_upcast  # noqa: PLC0415 - CLI startup

        model, tokenizer = guard(load_model, judge_model, dtype=dtype or "float32")
        backend = guard(HFBackend, model, tokenizer, model_id=judge_model, max_tokens=max_tokens,
                        reasoning_effort=reasoning_effort)
        products = float32_products(model_upcast(model)[0])  # bfloat16 on a CPU without bfloat16 hardware
    with progress_view(console=console) as bar, products:  # units judged, elapsed, time left: a pass can take hours
        task = bar.add_task(f"judge {safe(name)}: units", total=None, stage=shown(Path(run_dir).name))

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        result = guard(rejudge_run, run_dir, backend, name, data, progress=advance, template=judge_template)
    print(f"judge {name}: {result.judged} answers judged ({result.calls} calls, {result.cache_hits} cached), "
          f"{len(result.failures)} failure(s)")
    if result.judged and len(result.failures) >= result.judged:  # a failed pass, never mistaken for no judge
        console.print(f"[bold red]failed:[/] judge pass {safe(name)}: all {result.judged} verdicts failed; figures "
                      "and reports show the pass as failed, without scores")
    for failure in result.failures[:20]:  # dataset strings and replies: shown, never interpreted by the terminal
        print(f"  failed: {shown(failure['record_id'])} {shown(failure['selector'])} @ {failure['budget']:g} "
              f"{shown(failure['condition'])}: {shown(repr(failure['reply']))}")
    if len(result.failures) > 20:
        print(f"  ... {len(result.failures) - 20} more in {shown(Path(run_dir) / f'judge_{name}_failures.json')}")
    written = ", ".join(result.metrics) or "none: the run has no answers"
    console.print(f"[green]updated[/] {safe(run_dir)} (scores {written})")
