"""Request-level benchmarks (not tests): Table 3 overhead of complete requests, and batched-row throughput.

``relaylens bench overhead`` (the paper's Table 3): complete requests — history prefill, selection, relocation,
question pass and ``new_tokens`` greedy steps (EOS disabled, so every request decodes exactly that many) — for
``original`` and ``relay`` on the same record, selector and budget; BM25, SnapKV and PyramidKV at two absolute
budgets. CPU-sized defaults: 2 bundled records (~2,000-token histories), budgets of 256 and 1,024 kept states per
head, 128 tokens, 3 repetitions (the paper: B2048 / B8192 on a GPU with long histories). Each repetition runs the two
conditions back to back (alternating which goes first); a record's time per condition is the median of its
repetitions; the overhead is the geometric mean over records of the paired ratio relay / original, minus one. Stage
times are reported separately (relocation next to a float32 copy of the same kept cache). Memory: the historical KV
cache's logical bytes (identical across conditions), device peaks (``torch.cuda.max_memory_allocated`` /
``max_memory_reserved``) on CUDA and the peak resident set above the level before the request on CPU. CUDA is
synchronised at every stage boundary.

``relaylens bench throughput``: a record's rows one by one vs in one batch (tokens per second, wall time, same
tokens), and the batched wall time for 1, 2, 5, 9 and 12 rows.

Example:
    $ relaylens bench overhead --repeats 3
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import torch

from relaylens.bench_model import DEFAULT_MODEL, load_bench_model, proc_status_kb, sample_prompts

OVERHEAD_SELECTORS = ("bm25", "snapkv", "pyramidkv")
CPU_BUDGETS = (256, 1024)
ROW_COUNTS = (1, 2, 5, 9, 12)


def synchronize(device) -> None:
    """Wait for queued device work (CUDA); a no-op on CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class MemoryProbe:
    """Peak memory of one request: CUDA allocator peaks on CUDA, the resident-set high-water mark on CPU (MB)."""

    device: torch.device
    before_kb: int | None = None
    peaks: dict = field(default_factory=dict)

    def __enter__(self) -> MemoryProbe:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = (torch.cuda.memory_allocated(self.device), torch.cuda.memory_reserved(self.device))
        else:
            self.before_kb = proc_status_kb("VmRSS")
            try:
                with open("/proc/self/clear_refs", "w") as handle:
                    handle.write("5")  # reset the high-water mark to the current resident set
            except OSError:
                self.before_kb = None
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            self.peaks = {"peak_allocated_mb": (torch.cuda.max_memory_allocated(self.device) - self.base[0]) / 2**20,
                          "peak_reserved_mb": (torch.cuda.max_memory_reserved(self.device) - self.base[1]) / 2**20}
        else:
            peak = proc_status_kb("VmHWM")
            self.peaks = {"peak_rss_mb": None if self.before_kb is None or peak is None else (peak - self.before_kb) / 1024}


def kv_logical_bytes(selection, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of the kept historical keys and values (valid slots only; the same for every condition)."""
    element = torch.empty((), dtype=dtype).element_size()
    return int(selection.valid.sum()) * head_dim * 2 * element


def complete_request(model, prompt, selector, budget, condition: str, factors, new_tokens: int) -> dict:
    """One complete request with stage times (CUDA synchronised at each boundary) and memory peaks."""
    from relaylens.prefill import prefill_history
    from relaylens.relocation import relocate_selection
    from relaylens.rows import GenerationResult, decode_rows, forward_rows, stack_rows

    device = model.device
    stamps = {}
    with MemoryProbe(device) as memory:
        synchronize(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        prefill = prefill_history(model, prompt.history_ids)
        synchronize(device)
        stamps["prefill_s"] = time.perf_counter()
        selection = selector.select(prefill, prompt, budget)
        synchronize(device)
        stamps["selection_s"] = time.perf_counter()
        layers = relocate_selection(prefill, selection, condition, factors)
        batch = stack_rows([layers])
        synchronize(device)
        stamps["relocation_s"] = time.perf_counter()
        q = prompt.question_ids.numel()
        positions = layers.coordinates.question_positions(q)[None]  # [1, Q]
        source = (torch.arange(q) + prefill.history_length)[None]
        logits = forward_rows(model, batch, prompt.question_ids[None], positions, source)
        synchronize(device)
        stamps["question_s"] = time.perf_counter()
        result = GenerationResult(layers.coordinates.condition, layers.coordinates.question_start, positions[0], logits[0, -1])
        decode_rows(model, batch, [result], logits[:, -1], positions[:, -1] + 1, source[:, -1] + 1, new_tokens, set(), None, False)
        synchronize(device)
        stamps["generation_s"] = time.perf_counter()
        request_cpu_s = time.process_time() - cpu_start  # CPU time of this process: robust to other load on the cores
    times, previous = {}, start
    for stage, stamp in stamps.items():
        times[stage], previous = stamp - previous, stamp
    kept = [keys for keys, _ in layers.data]  # [kv_head, slot, head_dim] per layer: the same cache, for the copy
    synchronize(device)
    copy_start = time.perf_counter()
    for keys in kept:
        keys.float().clone()
    synchronize(device)
    times["float32_copy_s"] = time.perf_counter() - copy_start
    return {**times, "request_s": stamps["generation_s"] - start, "request_cpu_s": request_cpu_s, "tokens": len(result.token_ids),
            "kv_logical_mb": kv_logical_bytes(selection, prefill.keys[0].shape[-1], prefill.keys[0].dtype) / 2**20,
            **memory.peaks}


def geometric_overhead(ratios: list[float]) -> float:
    """Geometric mean of paired ratios minus one (Table 3's statistic); NaN for no ratios.

    Example:
        >>> round(geometric_overhead([1.01, 1.03]), 4)
        0.02
    """
    ratios = [r for r in ratios if r > 0 and math.isfinite(r)]
    return math.exp(statistics.fmean(math.log(r) for r in ratios)) - 1 if ratios else float("nan")


def run_overhead(repeats: int = 3, records: int = 2, model_spec: str = DEFAULT_MODEL, new_tokens: int = 128,
                 selectors=OVERHEAD_SELECTORS, budgets=CPU_BUDGETS, load_kwargs: dict | None = None, **_) -> list[dict]:
    """Table 3 on the bundled sample: per (selector, budget) the relay-vs-original overhead of complete requests."""
    from relaylens.geometry import RotaryFactors
    from relaylens.selectors import make_selector

    model, tokenizer = load_bench_model(model_spec, load_kwargs)
    factors = RotaryFactors.from_model(model)
    prompts = sample_prompts(tokenizer, records)
    chosen = {name: make_selector(name) for name in selectors}
    complete_request(model, prompts[0], chosen[selectors[0]], budgets[0], "relay", factors, 4)  # warm-up
    rows, per_record = [], []
    bar = _request_bar(len(chosen) * len(budgets) * len(prompts) * repeats * 2)
    for name, selector in chosen.items():
        for budget in budgets:
            ratios, cpu_ratios = [], []
            for prompt in prompts:
                runs = {"original": [], "relay": []}
                for rep in range(repeats):
                    order = ("original", "relay") if rep % 2 == 0 else ("relay", "original")
                    for condition in order:
                        runs[condition].append(complete_request(model, prompt, selector, budget, condition, factors, new_tokens))
                        bar(f"{name} @ {budget}, {prompt.record_id}, {condition}")
                medians = {c: {k: statistics.median(r[k] for r in reps) for k in reps[0] if isinstance(reps[0][k], (int, float))
                               and reps[0][k] is not None} for c, reps in runs.items()}
                ratios.append(medians["relay"]["request_s"] / medians["original"]["request_s"])
                cpu_ratios.append(medians["relay"]["request_cpu_s"] / medians["original"]["request_cpu_s"])
                for condition, values in medians.items():
                    per_record.append({"benchmark": "overhead", "case": f"{prompt.record_id} (L={prompt.history_length})",
                                       "selector": name, "budget": budget, "condition": condition, **values,
                                       "ratio_vs_original": values["request_s"] / medians["original"]["request_s"]})
            relay = [r for r in per_record if r["selector"] == name and r["budget"] == budget and r["condition"] == "relay"]
            original = [r for r in per_record if r["selector"] == name and r["budget"] == budget and r["condition"] == "original"]
            rows.append({"benchmark": "overhead", "case": "geometric mean", "selector": name, "budget": budget,
                         "records": len(ratios), "overhead_pct": 100 * geometric_overhead(ratios),
                         "overhead_cpu_pct": 100 * geometric_overhead(cpu_ratios),  # the same statistic on CPU time
                         "relocation_ms_original": 1e3 * statistics.fmean(r["relocation_s"] for r in original),
                         "relocation_ms_relay": 1e3 * statistics.fmean(r["relocation_s"] for r in relay),
                         "float32_copy_ms": 1e3 * statistics.fmean(r["float32_copy_s"] for r in relay),
                         "request_s_original": statistics.fmean(r["request_s"] for r in original),
                         "request_s_relay": statistics.fmean(r["request_s"] for r in relay),
                         "kv_logical_mb": statistics.fmean(r["kv_logical_mb"] for r in relay),
                         "target": "<= +1.0% (paper: +1.34% to +2.70%)"})
    bar(None)
    return per_record + rows


def _request_bar(total: int):
    """A progress bar on stderr for ``total`` requests: call it with a label after each request, with None to close."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    view = Progress(TextColumn("overhead"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[last]}"),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True))
    task = view.add_task("requests", total=total, last="")
    view.start()

    def advance(label: str | None) -> None:
        if label is None:
            view.stop()
            return
        view.update(task, advance=1, last=label)

    return advance


def run_throughput(repeats: int = 1, model_spec: str = DEFAULT_MODEL, new_tokens: int = 128, record: int = 0,
                   counts=ROW_COUNTS, load_kwargs: dict | None = None, **_) -> list[dict]:
    """One record's rows one by one vs in one batch (5 rows), then the batched wall time for ``counts`` rows."""
    from relaylens.generation import run_condition
    from relaylens.geometry import RotaryFactors
    from relaylens.prefill import prefill_history
    from relaylens.rows import Row, run_rows
    from relaylens.selectors import make_selector

    model, tokenizer = load_bench_model(model_spec, load_kwargs)
    factors = RotaryFactors.from_model(model)
    prompt = sample_prompts(tokenizer, record + 1)[record]
    prefill = prefill_history(model, prompt.history_ids)
    selections = [make_selector(name).select(prefill, prompt, 0.1) for name in ("snapkv", "pyramidkv", "bm25")]
    conditions = ("original", "key_only", "relay", "query_only(2048)", "common_shift(2048)")  # coordinate_ablation
    pool = [(sel, cond) for sel in selections for cond in conditions]  # 15 rows: selectors x conditions
    common = dict(max_new_tokens=new_tokens, factors=factors, eos_token_ids=set())
    run_rows(model, prefill, [Row(*pool[0])], prompt.question_ids, **{**common, "max_new_tokens": 2})  # warm-up
    five = pool[:5]

    def sequential():
        return [run_condition(model, prefill, sel, cond, prompt.question_ids, **common) for sel, cond in five]

    def batched(rows):
        return run_rows(model, prefill, [Row(sel, cond) for sel, cond in rows], prompt.question_ids, **common)

    seq_s, bat_s, same = [], [], True
    for _ in range(repeats):
        start = time.perf_counter()
        one_by_one = sequential()
        seq_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        together = batched(five)
        bat_s.append(time.perf_counter() - start)
        same &= [r.token_ids for r in one_by_one] == [r.token_ids for r in together]
    tokens = 5 * new_tokens
    seq, bat = statistics.median(seq_s), statistics.median(bat_s)
    rows = [{"benchmark": "throughput", "case": f"{prompt.record_id}: 5 rows x {new_tokens} tokens", "sequential_s": seq,
             "batched_s": bat, "speedup": seq / bat, "sequential_tok_s": tokens / seq, "batched_tok_s": tokens / bat,
             "same_tokens": bool(same), "target": ">= 2.5x"}]
    for count in counts:
        chosen = pool[:count] if count <= len(pool) else (pool * 2)[:count]
        wall = statistics.median(_timed_run(lambda chosen=chosen: batched(chosen)) for _ in range(repeats))
        rows.append({"benchmark": "throughput", "case": f"{count} rows batched", "rows": count, "batched_s": wall,
                     "batched_tok_s": count * new_tokens / wall, "s_per_row": wall / count})
    return rows


def _timed_run(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
