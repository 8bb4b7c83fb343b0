"""``relaylens bench regime`` (not a test): records per hour of the paper's regime, before and after, in one run.

The paper's regime is ``coordinate_ablation`` with its own spec: BM25 at 10%, five conditions decoded in one batch,
answers up to 512 tokens, the end-of-answer stop (``stop="auto"``) and protected framing, in bfloat16. Two decoding
paths are compared on it, switched by two module flags:

* ``before``: :data:`relaylens.model.packed.PACKED_DECODING` and
  :data:`relaylens.generation.attention.FUSED_UNOBSERVED` both False (plain ``F.linear``; the relaylens attention
  function on every pass);
* ``after``: both True, the defaults (oneDNN-prepacked bfloat16 linear weights in decoding steps; the fused SDPA
  kernel on unobserved passes).

Per model of the comma-separated ``model_spec`` and per arm, in a fresh process each (``python -m relaylens.bench.regime
--arm ...``): load the model, set the flags, run one warm-up record, then time the first ``records`` records (of the
bundled sample, or of ``data``) one at a time, as ``relaylens run`` runs them. Rows: seconds per record (median, and
each record's), records per hour (over all timed records), prefill seconds per record, generated tokens per second (the
answers table's ``new_tokens`` over the timed seconds), the rate of answers that hit the token limit, the fraction of
answers with the same text in both arms, and per arm the CPU, torch's thread count, the flags that ran and whether
packing applied (a torch without oneDNN, or a model that is not bfloat16 on the CPU, packs nothing: there "after" is
"before" with the fused kernel only).

Example:
    $ relaylens bench regime --model qwen2.5-coder-0.5b-instruct --records 2
    >>> before = dict(record_s=20.0, record_times_s=[20.0], tokens_per_s=50.0, hit_limit_rate=0.0, cpu="CPU",
    ...               prefill_s=5.0,
    ...               flags=dict(PACKED_DECODING=False, FUSED_UNOBSERVED=False), packing_available=True,
    ...               packed_linears=0, dtype="bfloat16", max_new_tokens=512)
    >>> after = dict(before, record_s=10.0, record_times_s=[10.0], tokens_per_s=100.0,
    ...              flags=dict(PACKED_DECODING=True, FUSED_UNOBSERVED=True), packed_linears=169)
    >>> [(r["case"], r["speedup"]) for r in regime_rows("m", before, after, (1.0, 9.0, 5))][2:4]
    [('coordinate_ablation record (s, median)', 2.0), ('coordinate_ablation records per hour (all timed records)', 2.0)]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import torch

from relaylens.bench.dtype import answer_agreement, record_config, run_arm_process, run_records, timed_records
from relaylens.bench.machine import cpu_info
from relaylens.errors import RelaylensError
from relaylens.generation import attention
from relaylens.model import packed

ARMS = {"before": False, "after": True}
"""Arm -> the value both flags (``PACKED_DECODING``, ``FUSED_UNOBSERVED``) take in it."""
DEFAULT_DTYPE = "bfloat16"  # the paper-regime runs' dtype


def run_regime(model_spec: str = "qwen2.5-coder-0.5b-instruct", records: int = 2, new_tokens: int | None = None,
               dtype: str | None = None, load_kwargs: dict | None = None, out: str | None = None,
               data: str | None = None, **_) -> list[dict]:
    """The rows of the table above, for each model of the comma-separated ``model_spec``.

    ``new_tokens`` caps the answers (default: the spec's 512; a cap is for quick checks, not the paper's regime).
    ``dtype`` defaults to bfloat16; it is not read from ``load_kwargs``, where the command always puts a resolved
    dtype (float32 on a CPU when ``--dtype`` is not given). The other ``load_kwargs`` placement options (device,
    attention kernel, rotary override) apply to both arms. ``data``: the records' file (default: the bundled
    sample; the committed paper-regime runs read ``data/lme_qwen_2048.json.gz``). Run directories are kept in
    ``out`` (default: a temporary folder).
    """
    dtype = str(dtype or DEFAULT_DTYPE).removeprefix("torch.")
    rows: list[dict] = []
    base = Path(out) if out else Path(tempfile.mkdtemp(prefix="relaylens-bench-regime-"))
    placement = {k: v for k, v in (load_kwargs or {}).items() if k != "dtype" and v is not None}
    for spec in [s.strip() for s in str(model_spec).split(",") if s.strip()]:
        arms = {}
        for arm in ARMS:
            command = [sys.executable, "-m", "relaylens.bench.regime", "--arm", arm, "--model", spec, "--dtype", dtype,
                       "--records", str(records), "--out", str(base / f"{spec.replace('/', '_')}-{arm}"),
                       "--placement", json.dumps(placement, default=str)]
            if new_tokens is not None:
                command += ["--new-tokens", str(new_tokens)]
            if data is not None:
                command += ["--data", str(data)]
            arms[arm] = run_arm_process(command, f"bench regime arm {spec} {arm}")
        agreement = answer_agreement(Path(arms["before"]["run_dir"]), Path(arms["after"]["run_dir"]), spec)
        rows.extend(regime_rows(spec, arms["before"], arms["after"], agreement))
    return rows


def regime_rows(spec: str, before: dict, after: dict, agreement: tuple[float, float, int]) -> list[dict]:
    """The table's rows for one model from its two arms' results (:func:`run_arm`) and their
    :func:`relaylens.bench.dtype.answer_agreement`. ``speedup``: how many times faster "after" is."""
    name = spec if len(spec) < 40 else spec[-40:]

    def row(case: str, first, second, speedup: float | None = None, **extra) -> dict:
        return {"benchmark": "regime", "model": name, "case": case, "before": first, "after": second,
                "speedup": speedup, **extra}

    same, prefix, total = agreement
    return [
        row("machine (CPU, torch threads)", before["cpu"], after["cpu"]),
        row("decoding path", _path_text(before), _path_text(after)),
        row("coordinate_ablation record (s, median)", before["record_s"], after["record_s"],
            before["record_s"] / after["record_s"]),
        row("coordinate_ablation records per hour (all timed records)", _per_hour(before), _per_hour(after),
            _per_hour(after) / _per_hour(before)),
        row("each record (s)", _times(before), _times(after)),
        row("prefill per record (s, mean)", before["prefill_s"], after["prefill_s"],
            before["prefill_s"] / after["prefill_s"] if after["prefill_s"] else None),
        row("generated tokens per second (all rows)", before["tokens_per_s"], after["tokens_per_s"],
            after["tokens_per_s"] / before["tokens_per_s"] if before["tokens_per_s"] else None),
        row(f"answers that hit the limit ({before['max_new_tokens']} tokens)", before["hit_limit_rate"],
            after["hit_limit_rate"]),
        row(f"same answer text ({total} rows)", None, None, agreement=same),
        row("mean tokens before the first difference (re-tokenised)", None, None, agreement=prefix),
    ]


def _path_text(arm: dict) -> str:
    flags = " ".join(f"{k}={v}" for k, v in arm["flags"].items())
    if not arm["packing_available"]:
        return f"{flags}; no oneDNN prepacked linear in this torch: no packing ({arm['dtype']})"
    return f"{flags}; {arm['packed_linears']} linear layers packed ({arm['dtype']})"


def _per_hour(arm: dict) -> float:
    """Records per hour over every timed record (a long answer counts for what it costs; the median hides it)."""
    return 3600 * len(arm["record_times_s"]) / sum(arm["record_times_s"])


def _times(arm: dict) -> str:
    return ", ".join(f"{t:.1f}" for t in arm["record_times_s"])


# ----------------------------------------------------------------------------------------------- one arm


def arm_flag(arm: str) -> bool:
    """The value both flags take in ``arm``; a name outside :data:`ARMS` is refused."""
    if arm not in ARMS:
        raise RelaylensError(f"bench regime arm must be one of {', '.join(ARMS)}; got {arm!r}. Fix: pass --arm "
                             "before (plain linear layers, no fused kernel) or --arm after (the defaults)")
    return ARMS[arm]


@contextlib.contextmanager
def decoding_flags(arm: str) -> Iterator[dict]:
    """Inside the block, both flags take the arm's value (:data:`ARMS`); on exit they get back the values they had.
    Yields the flags as set."""
    value = arm_flag(arm)
    saved = packed.PACKED_DECODING, attention.FUSED_UNOBSERVED
    try:
        packed.PACKED_DECODING = attention.FUSED_UNOBSERVED = value
        yield {"PACKED_DECODING": packed.PACKED_DECODING, "FUSED_UNOBSERVED": attention.FUSED_UNOBSERVED}
    finally:
        packed.PACKED_DECODING, attention.FUSED_UNOBSERVED = saved


def run_arm(model_spec: str, arm: str, records: int, out: Path, dtype: str = DEFAULT_DTYPE,
            new_tokens: int | None = None, placement: dict | None = None, data: str | None = None) -> dict:
    """One model on one decoding path, in this process: the measurements :func:`regime_rows` tabulates. ``out``
    (the timed run) and its warm-up sibling ``.warm-NAME`` must not hold a run yet, or nothing would be timed."""
    from relaylens.experiments.specs import load_analysis  # noqa: PLC0415 - late binding (tests swap it)
    from relaylens.model.loading import load_model  # noqa: PLC0415 - late binding (tests swap loading.load_model)

    arm_flag(arm)  # a bad arm is refused before anything loads
    warm = out.parent / f".warm-{out.name}"
    for path in (out, warm):
        if path.exists() and any(path.iterdir()):
            raise RelaylensError(f"bench regime times records into {path}, which already holds files (a finished "
                                 "record would be skipped, not timed). Fix: pass an empty or new --out folder")
    placement = placement or {}
    model, tokenizer = load_model(model_spec, dtype=dtype, **placement)
    spec = load_analysis("coordinate_ablation").spec
    if new_tokens is not None:
        spec = spec.replace(max_new_tokens=new_tokens)
    config = record_config(model_spec, dtype, placement, **({"data": data} if data else {}))
    with decoding_flags(arm) as flags:
        run_records(spec, config, 1, warm, (model, tokenizer))
        per_record = timed_records(spec, config, records, out, (model, tokenizer))
        packed_count = len(packed.pack_linears(model))  # the packs the decode used (cached; [] with the flag off)
    answers = pd.read_parquet(out / "answers.parquet")
    return {"model": model_spec, "arm": arm, "dtype": dtype, "flags": flags,
            "packing_available": packed.packing_available(), "packed_linears": packed_count,
            "max_new_tokens": spec.max_new_tokens, "record_s": statistics.median(per_record),
            "record_times_s": per_record, "generated_tokens": int(answers["new_tokens"].sum()),
            "tokens_per_s": float(answers["new_tokens"].sum()) / sum(per_record),
            "hit_limit_rate": float(answers["hit_limit"].mean()),
            "prefill_s": float(answers.groupby("record_id")["prefill_s"].first().mean()), "rows": len(answers),
            "run_dir": str(out),
            "threads": torch.get_num_threads(), "cpu": cpu_info().describe()}


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - run as a subprocess by run_regime
    parser = argparse.ArgumentParser(description="one arm of relaylens bench regime")
    parser.add_argument("--arm", required=True, choices=tuple(ARMS))
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default=DEFAULT_DTYPE)
    parser.add_argument("--records", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--out", required=True)
    parser.add_argument("--placement", default="{}")
    parser.add_argument("--data", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = run_arm(args.model, args.arm, args.records, Path(args.out), args.dtype, args.new_tokens,
                     json.loads(args.placement), args.data)
    print(json.dumps(result))


if __name__ == "__main__":  # pragma: no cover
    main()
