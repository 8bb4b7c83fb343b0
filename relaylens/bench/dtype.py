"""``relaylens bench dtype`` (not a test): float32 vs bfloat16 on the same model, in one run.

Per model and dtype, in a fresh process each (so peaks are not inherited): load time from the cache, prefill tokens per
second at 2,048 and 8,192 random tokens (chunks of 2,048, as runs prefill), then ``coordinate_ablation`` on the first
``records`` bundled records with 32 new tokens per row and no early stop: per record, prefill, BM25 selection at
10%, the five conditions decoded in one batch, probes and scoring, as ``relaylens run`` does it; seconds per record
(the median over records; the first record is run once before, to warm up) and records per hour. Memory: the
process's peak resident set and the peak above the loaded model during prefill and records (``/proc``; Linux).

Then, between the two dtypes of each model: how often they decode the same answer (the 32-token answers compared as
text, and as re-tokenised tokens up to the first difference) and how far the probes move (mean and largest absolute
difference per probe metric over every record, condition, layer and head).

Example:
    $ relaylens bench dtype --model qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct --records 3
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from relaylens.bench.model import peak_extra_mb, proc_status_kb
from relaylens.experiments.config import RunConfig
from relaylens.model.loading import load_tokenizer
from relaylens.model.prefill import prefill_history

DTYPES = ("float32", "bfloat16")
LENGTHS = (2048, 8192)
PROBE_METRICS = ("evidence_share", "history_share", "evidence_value_norm", "replay_gold_share")


def run_dtype(model_spec: str = "qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct", records: int = 3,
              new_tokens: int = 32, repeats: int = 2, load_kwargs: dict | None = None, out: str | None = None,
              lengths: tuple[int, ...] = LENGTHS, **_) -> list[dict]:
    """The rows of the table above, for each model of the comma-separated ``model_spec``.

    ``load_kwargs`` placement options other than the dtype (device, attention kernel, rotary override) apply to both
    arms. Each arm runs in ``python -m relaylens.bench.dtype`` (its own process); run directories are kept in ``out``
    (default: a temporary folder).
    """
    rows: list[dict] = []
    base = Path(out) if out else Path(tempfile.mkdtemp(prefix="relaylens-bench-dtype-"))
    placement = {k: v for k, v in (load_kwargs or {}).items() if k != "dtype" and v is not None}
    for spec in [s.strip() for s in str(model_spec).split(",") if s.strip()]:
        arms = {}
        for dtype in DTYPES:
            run_dir = base / f"{spec.replace('/', '_')}-{dtype}"
            command = [sys.executable, "-m", "relaylens.bench.dtype", "--model", spec, "--dtype", dtype,
                       "--records", str(records), "--new-tokens", str(new_tokens), "--repeats", str(repeats),
                       "--out", str(run_dir), "--placement", json.dumps(placement, default=str),
                       "--lengths", ",".join(str(n) for n in lengths)]
            arms[dtype] = run_arm_process(command, f"bench dtype arm {spec} {dtype}")
        rows.extend(_rows(spec, arms, lengths))
    return rows


def _rows(spec: str, arms: dict, lengths: tuple[int, ...]) -> list[dict]:
    f32, b16 = arms["float32"], arms["bfloat16"]
    name = spec if len(spec) < 40 else spec[-40:]
    rows = [{"benchmark": "dtype", "model": name, "case": "load from cache (s)", "float32": f32["load_s"],
             "bfloat16": b16["load_s"], "speedup": f32["load_s"] / b16["load_s"], "target": "<= 5 s (0.5B)"}]
    for length in lengths:
        key = str(length)
        rows.append({"benchmark": "dtype", "model": name, "case": f"prefill {length} tokens (tokens/s)",
                     "float32": f32["prefill_tokens_per_s"][key], "bfloat16": b16["prefill_tokens_per_s"][key],
                     "speedup": b16["prefill_tokens_per_s"][key] / f32["prefill_tokens_per_s"][key],
                     "target": ">= 4x (Qwen2.5-0.5B)"})
        rows.append({"benchmark": "dtype", "model": name, "case": f"prefill {length} tokens, peak above model (MB)",
                     "float32": f32["prefill_peak_mb"][key], "bfloat16": b16["prefill_peak_mb"][key]})
    rows.append({"benchmark": "dtype", "model": name, "case": "coordinate_ablation record (s, median)",
                 "float32": f32["record_s"], "bfloat16": b16["record_s"], "speedup": f32["record_s"] / b16["record_s"],
                 "target": ">= 3x (Qwen2.5-0.5B)"})
    rows.append({"benchmark": "dtype", "model": name, "case": "coordinate_ablation records per hour",
                 "float32": 3600 / f32["record_s"], "bfloat16": 3600 / b16["record_s"],
                 "speedup": f32["record_s"] / b16["record_s"]})
    rows.append({"benchmark": "dtype", "model": name, "case": "records: peak above model (MB)",
                 "float32": f32["records_peak_mb"], "bfloat16": b16["records_peak_mb"]})
    rows.append({"benchmark": "dtype", "model": name, "case": "process peak resident set (MB)",
                 "float32": f32["process_peak_mb"], "bfloat16": b16["process_peak_mb"]})
    same, prefix, total = answer_agreement(Path(f32["run_dir"]), Path(b16["run_dir"]), f32["model"])
    rows.append({"benchmark": "dtype", "model": name, "case": f"same answer text ({total} rows)",
                 "float32": None, "bfloat16": None, "agreement": same})
    rows.append({"benchmark": "dtype", "model": name, "case": "mean tokens before the first difference (re-tokenised)",
                 "float32": None, "bfloat16": None, "agreement": prefix})
    for metric, (mean, largest, count) in probe_differences(Path(f32["run_dir"]), Path(b16["run_dir"])).items():
        rows.append({"benchmark": "dtype", "model": name,
                     "case": f"probe {metric}: |bf16 - fp32| mean / max ({count} values)",
                     "float32": mean, "bfloat16": largest})
    return rows


def answer_agreement(first: Path, second: Path, model_spec: str) -> tuple[float, float, int]:
    """``(fraction of rows with the same answer text, mean re-tokenised tokens before the first difference, rows)``
    between two runs of the same records and conditions."""

    keys = ["record_id", "selector", "budget", "condition"]
    a = pd.read_parquet(first / "answers.parquet")[keys + ["answer"]]
    b = pd.read_parquet(second / "answers.parquet")[keys + ["answer"]]
    joined = a.merge(b, on=keys, suffixes=("_a", "_b"))
    if joined.empty:
        return float("nan"), float("nan"), 0
    tokenizer = load_tokenizer(model_spec)
    prefixes = []
    for x, y in zip(joined["answer_a"], joined["answer_b"]):
        tx, ty = tokenizer(x, add_special_tokens=False)["input_ids"], tokenizer(y,
                                                                                add_special_tokens=False)["input_ids"]
        common = next((i for i, (p, q) in enumerate(zip(tx, ty)) if p != q), min(len(tx), len(ty)))
        prefixes.append(common)
    return float((joined["answer_a"] == joined["answer_b"]).mean()), float(statistics.fmean(prefixes)), len(joined)


def probe_differences(first: Path, second: Path) -> dict[str, tuple[float, float, int]]:
    """``metric -> (mean |difference|, largest |difference|, values compared)`` between two runs' probe tables."""
    a, b = pd.read_parquet(first / "probes.parquet"), pd.read_parquet(second / "probes.parquet")
    keys = [c for c in a.columns if c != "value"]
    joined = a.merge(b, on=keys, suffixes=("_a", "_b"))
    out = {}
    for metric in PROBE_METRICS:
        part = joined[joined["metric"] == metric]
        if part.empty:
            continue
        diff = (part["value_a"] - part["value_b"]).abs().dropna()
        out[metric] = (float(diff.mean()), float(diff.max()), int(len(diff)))
    return out


# ----------------------------------------------------------------------------------------------- one arm


def run_arm_process(command: list[str], label: str) -> dict:
    """Run one arm in its own process (``python -m ...``; ``bench dtype`` and ``bench regime``) and return the JSON
    object it printed last; a failed arm raises with the tail of its stderr, named by ``label``."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{label} failed (exit {done.returncode}):\n{done.stderr.strip()[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def record_config(model_spec: str, dtype: str, placement: dict, **extra) -> dict:
    """The :class:`RunConfig` fields of an arm's runs: the model, its dtype, the placement options a run records."""
    kept = ("device", "attn_implementation", "rope_scaling", "max_position")
    return dict(model=model_spec, dtype=dtype, **extra, **{k: v for k, v in placement.items() if k in kept})


def run_records(spec, config: dict, limit: int, out: Path, model_and_tokenizer) -> None:
    """``coordinate_ablation`` (or ``spec``) on the first ``limit`` records into ``out``, as ``relaylens run`` runs
    them; records already in ``out`` are skipped (a resumed run)."""
    from relaylens.experiments.runner import run_analysis  # noqa: PLC0415 - import cost: transformers loads on first use; late binding (tests spy on it)

    run_analysis(spec, RunConfig(limit=limit, out=str(out), force=True, view_records=0, **config), progress=False,
                 model_and_tokenizer=model_and_tokenizer)


def timed_records(spec, config: dict, records: int, out: Path, model_and_tokenizer) -> list[float]:
    """Seconds of each of the first ``records`` records, run one more at a time into ``out`` (:func:`run_records`)."""
    times = []
    for count in range(1, records + 1):  # resumes: each call runs exactly one more record
        begin = time.perf_counter()
        run_records(spec, config, count, out, model_and_tokenizer)
        times.append(time.perf_counter() - begin)
    return times


def _arm(model_spec: str, dtype: str, records: int, new_tokens: int, repeats: int, out: Path, placement: dict,
         lengths: tuple[int, ...] = LENGTHS) -> dict:
    """One model in one dtype, in this process: the measurements :func:`run_dtype` tabulates."""

    from relaylens.experiments.specs import load_analysis  # noqa: PLC0415 - late binding (tests swap specs.load_analysis)
    from relaylens.model.loading import load_model  # noqa: PLC0415 - late binding (tests swap loading.load_model)

    started = time.perf_counter()
    model, tokenizer = load_model(model_spec, dtype=dtype, **placement)
    load_s = time.perf_counter() - started
    gc.collect()
    load_peak_kb, loaded_kb = proc_status_kb("VmHWM"), proc_status_kb("VmRSS")
    tokens, peaks = {}, {}
    vocab = model.get_input_embeddings().num_embeddings
    for length in lengths:
        ids = torch.randint(min(100, vocab // 4), min(20000, vocab), (length,),
                            generator=torch.Generator().manual_seed(length))
        limit = getattr(model.config, "max_position_embeddings", None)
        if length == lengths[0]:
            prefill_history(model, ids[:256], chunk_size=2048)  # warm-up (kernels, allocator)
        times = []
        for _ in range(repeats):
            begin = time.perf_counter()
            prefill_history(model, ids, chunk_size=2048, allow_long=limit is not None and length > limit)
            times.append(time.perf_counter() - begin)
        tokens[str(length)] = length / statistics.median(times)
        _, peaks[str(length)] = peak_extra_mb(lambda: prefill_history(model, ids, chunk_size=2048,
                                                                      allow_long=limit is not None and length > limit))
    spec = load_analysis("coordinate_ablation").spec.replace(max_new_tokens=new_tokens, stop="none")
    config = record_config(model_spec, dtype, placement)
    run_records(spec, config, 1, out.parent / f".warm-{out.name}", (model, tokenizer))
    per_record = []
    _, records_peak = peak_extra_mb(lambda: per_record.extend(timed_records(spec, config, records, out,
                                                                            (model, tokenizer))))
    return {"model": model_spec, "dtype": dtype, "load_s": load_s, "prefill_tokens_per_s": tokens,
            "prefill_peak_mb": peaks, "record_s": statistics.median(per_record), "record_times_s": per_record,
            "records_peak_mb": records_peak, "process_peak_mb": _process_peak(load_peak_kb, loaded_kb,
                                                                               [*peaks.values(), records_peak]),
            "run_dir": str(out), "threads": torch.get_num_threads()}


def _process_peak(load_peak_kb: int | None, loaded_kb: int | None, extra_mb: list) -> float | None:
    """The process's peak resident set in MB: the load's own peak, or the loaded model plus the largest peak above
    it (the high-water mark is reset before each measured step)."""
    if load_peak_kb is None or loaded_kb is None or any(m is None for m in extra_mb):
        return None
    return max(load_peak_kb / 1024, loaded_kb / 1024 + max(extra_mb))


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - run as a subprocess by run_dtype

    parser = argparse.ArgumentParser(description="one arm of relaylens bench dtype")
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", required=True, choices=DTYPES)
    parser.add_argument("--records", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--placement", default="{}")
    parser.add_argument("--lengths", default=",".join(str(n) for n in LENGTHS))
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = _arm(args.model, args.dtype, args.records, args.new_tokens, args.repeats, Path(args.out),
                  json.loads(args.placement), tuple(int(n) for n in args.lengths.split(",")))
    print(json.dumps(result))


if __name__ == "__main__":  # pragma: no cover
    main()
