"""Model-level benchmarks (not tests): probe cost, prefill throughput, selector memory, scaling (request-level ones:
:mod:`relaylens.bench.requests`).

Every ratio compares two things measured in the same process, interleaved, as medians of repeated runs. Peak
memory is the kernel's high-water mark above the resident set before the call (``/proc/self/clear_refs``; Linux).

Example:
    $ relaylens bench probes
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import subprocess
import sys
import time

import torch

from relaylens.datasets import bundled_sample_path, load_records
from relaylens.datasets.prompting import render_prompt
from relaylens.geometry.rotary import RotaryFactors, relocate_keys
from relaylens.geometry.selection import Selection
from relaylens.model.catalogue import DEFAULT_MODEL
from relaylens.model.hf import new_cache
from relaylens.model.prefill import PrefillResult, prefill_history
from relaylens.probes.readouts import FinalTokenRecorder
from relaylens.selectors import make_selector


def proc_status_kb(field: str) -> int | None:
    """A ``/proc/self/status`` field in kB (``VmRSS``, ``VmHWM``); None where the file or field is missing."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark (``VmHWM``) to the current resident set (``/proc/self/clear_refs``);
    False where that is not possible (not Linux, no permission)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


def resident_peak_kb() -> int | None:
    """The resident set's high-water mark in kB: ``VmHWM``, or ``VmRSS`` where it is larger (the kernel folds the
    current resident set into its mark lazily, so the mark can read below what is resident now)."""
    marks = [kb for kb in (proc_status_kb("VmHWM"), proc_status_kb("VmRSS")) if kb is not None]
    return max(marks) if marks else None


def peak_extra_mb(fn) -> tuple[object, float | None]:
    """Run ``fn()``; return its result and the peak resident memory above the level before it, in MB."""
    gc.collect()
    before = proc_status_kb("VmRSS") if reset_peak_rss() else None
    result = fn()
    peak = resident_peak_kb()
    return result, None if before is None or peak is None else (peak - before) / 1024


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _paired_medians(first, second, repeats: int) -> tuple[float, float]:
    """Interleave the two measurements so drift hits both alike; medians of ``repeats``."""
    a, b = [], []
    for _ in range(repeats):
        a.append(_timed(first))
        b.append(_timed(second))
    return statistics.median(a), statistics.median(b)


def sample_prompts(tokenizer, count: int):
    """Completion-mode prompts of the first ``count`` records of the bundled sample."""
    records = load_records(bundled_sample_path())[:count]
    return [render_prompt(record, tokenizer, mode="completion") for record in records]


def load_bench_model(model_spec: str, load_kwargs: dict | None = None):
    """The benchmarked model; ``load_kwargs`` are :func:`relaylens.model.loading.load_model` placement options
    (device, dtype, device map, attention kernel, rotary overrides)."""
    from relaylens.model.loading import load_model  # noqa: PLC0415 - late binding (tests swap loading.load_model)

    return load_model(model_spec, **(load_kwargs or {}))


def run_probes(repeats: int = 5, records: int = 3, model_spec: str = DEFAULT_MODEL, load_kwargs: dict | None = None,
               **_) -> list[dict]:
    """Probed vs unprobed question pass (relaylens attention both times; the probe records the final-token rows)."""
    from relaylens.generation.single import run_condition  # noqa: PLC0415 - import cost: transformers loads on first use

    model, tokenizer = load_bench_model(model_spec, load_kwargs)
    factors = RotaryFactors.from_model(model)
    rows, ratios = [], []
    for prompt in sample_prompts(tokenizer, records):
        prefill = prefill_history(model, prompt.history_ids)
        selection = make_selector("snapkv").select(prefill, prompt, 0.10)

        def plain():
            run_condition(model, prefill, selection, "relay", prompt.question_ids, max_new_tokens=0, factors=factors)

        def probed():
            run_condition(model, prefill, selection, "relay", prompt.question_ids, max_new_tokens=0, factors=factors,
                          observers=[FinalTokenRecorder()])

        plain()
        unprobed_s, probed_s = _paired_medians(plain, probed, repeats)
        ratios.append(probed_s / unprobed_s)
        rows.append({"benchmark": "probes", "case": prompt.record_id, "unprobed_s": unprobed_s, "probed_s": probed_s,
                     "ratio": probed_s / unprobed_s, "target": "<= 1.15"})
    rows.append({"benchmark": "probes", "case": "median", "ratio": statistics.median(ratios), "target": "<= 1.15"})
    return rows


def run_prefill(repeats: int = 3, lengths=(1000, 4000), model_spec: str = DEFAULT_MODEL,
                load_kwargs: dict | None = None, **_) -> list[dict]:
    """relaylens prefill vs a plain ``model(...)`` sdpa forward with cache on the same tokens (throughput ratio)."""
    model, _ = load_bench_model(model_spec, load_kwargs)
    rows = []
    for length in lengths:
        ids = torch.randint(100, 20000, (length,), generator=torch.Generator().manual_seed(length))

        def plain():
            with torch.inference_mode():
                model(ids[None], use_cache=True, cache=new_cache())

        def ours():
            prefill_history(model, ids)

        ours()
        plain_s, ours_s = _paired_medians(plain, ours, repeats)
        _, plain_mb = peak_extra_mb(plain)
        _, ours_mb = peak_extra_mb(ours)
        rows.append({"benchmark": "prefill", "case": f"L={length}", "plain_s": plain_s, "relaylens_s": ours_s,
                     "throughput_ratio": plain_s / ours_s, "plain_peak_mb": plain_mb, "relaylens_peak_mb": ours_mb,
                     "target": ">= 0.95"})
    return rows


def run_selectors(length: int = 8000, **_) -> list[dict]:
    """Peak extra memory of H2O's column-sum capture vs the plain prefill (each in a fresh subprocess)."""
    rows, results = [], {}
    for mode in ("plain", "h2o"):
        command = [sys.executable, "-m", "relaylens.bench.selector_memory", "--mode", mode, "--length", str(length)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[mode] = json.loads(out.strip().splitlines()[-1])
    plain_mb, h2o_mb = results["plain"]["peak_extra_mb"], results["h2o"]["peak_extra_mb"]
    rows.append({"benchmark": "selector memory", "case": f"H2O scoring, SmolLM2 geometry, L={length}",
                 "plain_peak_mb": plain_mb, "selector_peak_mb": h2o_mb, "ratio": h2o_mb / plain_mb, "target": "<= 1.5"})
    return rows


def run_scaling(repeats: int = 3, counts=(1000, 4000, 16000), model_spec: str = DEFAULT_MODEL,
                load_kwargs: dict | None = None, **_) -> list[dict]:
    """Relocation and question-pass time as the retained count grows; growth exponents from a log-log fit."""
    from relaylens.generation.single import run_condition  # noqa: PLC0415 - import cost: transformers loads on first use

    model, _ = load_bench_model(model_spec, load_kwargs)
    config = model.config
    # a timing benchmark: 16k retained states of a 32k history run past SmolLM2's trained 8k context, which default
    # RoPE computes all the same; widen the checked range for this measurement only
    config.max_position_embeddings = max(config.max_position_embeddings, 4 * max(counts))
    factors = RotaryFactors.from_model(model)
    layers, kv_heads, head_dim = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    question = torch.randint(100, 20000, (30,), generator=torch.Generator().manual_seed(0))
    rows, relocate_times, question_times = [], [], []
    for count in counts:
        length = 2 * count
        keys = torch.randn(layers, kv_heads, count, head_dim)  # [layer, kv_head, slot, head_dim]
        source = torch.arange(0, length, 2).expand(layers, kv_heads, count)
        target = torch.arange(count).expand(layers, kv_heads, count)
        relocate_s = statistics.median(_timed(lambda: relocate_keys(keys, source, target,
                                                                    factors)) for _ in range(repeats))
        prefill = PrefillResult(torch.zeros(length, dtype=torch.long),
                                [torch.randn(kv_heads, length, head_dim) for _ in range(layers)],
                                [torch.randn(kv_heads, length, head_dim) for _ in range(layers)],
                                None, 0, head_dim**-0.5, config.num_attention_heads // kv_heads)
        selection = Selection(source.clone(), torch.ones_like(source, dtype=torch.bool), length)
        question_s = statistics.median(
            _timed(lambda: run_condition(model, prefill, selection, "relay", question, max_new_tokens=0,
                                         factors=factors))
            for _ in range(repeats))
        relocate_times.append(relocate_s)
        question_times.append(question_s)
        rows.append({"benchmark": "scaling", "case": f"{count} states/head", "relocate_s": relocate_s,
                     "question_pass_s": question_s})
    rows.append({"benchmark": "scaling", "case": "growth exponent (log-log slope)",
                 "relocate_s": _slope(counts, relocate_times), "question_pass_s": _slope(counts, question_times)})
    return rows


def _slope(xs, ys) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)
