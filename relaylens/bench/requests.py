"""Request-level benchmarks (not tests): Table 3 overhead of complete requests, and batched-row throughput.

``relaylens bench overhead`` (the paper's Table 3): complete requests — history prefill, selection, relocation,
question pass and ``new_tokens`` greedy steps (EOS disabled, so every request decodes exactly that many) — for
``original`` and ``relay`` on the same record, selector and budget; BM25, SnapKV and PyramidKV at two absolute
budgets. CPU-sized defaults: 4 bundled records (~2,000-token histories, prefilled in chunks of 256 tokens), budgets of
256 and 1,024 kept states per head, 128 tokens, 3 repetitions (the paper: B2048 / B8192 on a GPU with long
histories). Each repetition runs the two conditions' requests interleaved piece by piece (prefill chunk, selection,
relocation, question, each decoding step; alternating which goes first) and sums each request's own piece times, so
the speed swings of a shared machine hit both alike (``schedule="back-to-back"``: one whole request after the other).
A record's time per condition is the median of its repetitions; the overhead is the geometric mean over records of the
paired ratio relay / original, minus one. Stage times are reported separately (relocation next to a float32 copy of
the same kept cache). Memory: the historical KV cache's logical bytes (identical across conditions), device peaks
(``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``) on CUDA and the peak resident set above the level
before the request on CPU, from one back-to-back request per condition on the first record (run before the timed
ones, with the default allocator). CUDA is synchronised around every piece.

``relaylens bench throughput``: a record's rows one by one vs in one batch (tokens per second, wall time, same
tokens), and the batched wall time for 1, 2, 5, 9 and 12 rows.

Example:
    $ relaylens bench overhead --repeats 3
"""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import time
from dataclasses import dataclass, field

import torch

from relaylens.bench.model import (
    DEFAULT_MODEL,
    load_bench_model,
    proc_status_kb,
    reset_peak_rss,
    resident_peak_kb,
    sample_prompts,
)
from relaylens.errors import BudgetError, PositionError, RelaylensError
from relaylens.geometry.rotary import RotaryFactors
from relaylens.model.prefill import PrefillPieces, prefill_history
from relaylens.progress import progress_view
from relaylens.reporting.overhead import geometric_mean_minus_one
from relaylens.selectors import make_selector

OVERHEAD_SELECTORS = ("bm25", "snapkv", "pyramidkv")
CPU_BUDGETS = (256, 1024)
ROW_COUNTS = (1, 2, 5, 9, 12)  # batched decoding's scaling with the number of rows
COMPARED_COUNTS = (5, 9, 12)  # rows run one by one and in one batch


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
            self.before_kb = proc_status_kb("VmRSS") if reset_peak_rss() else None
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            self.peaks = {"peak_allocated_mb": (torch.cuda.max_memory_allocated(self.device) - self.base[0]) / 2**20,
                          "peak_reserved_mb": (torch.cuda.max_memory_reserved(self.device) - self.base[1]) / 2**20}
        else:
            peak = resident_peak_kb()
            self.peaks = {"peak_rss_mb": None if self.before_kb is None or peak is None
                          else (peak - self.before_kb) / 1024}


def kv_logical_bytes(selection, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of the kept historical keys and values (valid slots only; the same for every condition)."""
    element = torch.empty((), dtype=dtype).element_size()
    return int(selection.valid.sum()) * head_dim * 2 * element


def request_pieces(model, prompt, selector, budget, condition: str, factors, new_tokens: int, out: dict,
                   prefill_chunk: int | None = None):
    """One complete request as a generator that yields the stage each finished piece of work belongs to.

    The pieces are the prefill (one per ``prefill_chunk`` tokens; None or 0: one piece), the selection, the
    relocation, the question pass and every decoding step (each ``"generation_s"``). A driver times each ``next()``,
    so the requests of two conditions can run interleaved piece by piece (:func:`timed_pair`); on return, ``out``
    holds the request's ``layers``, ``selection``, ``prefill``, ``tokens`` and ``token_ids``.
    """
    from relaylens.generation.cache import relocate_selection  # noqa: PLC0415 - import cost: transformers loads on first use
    from relaylens.generation.rows import GenerationResult, decode_steps, forward_rows, stack_rows  # noqa: PLC0415 - import cost: transformers loads on first use
    from relaylens.generation.settings import DecodeSettings  # noqa: PLC0415 - import cost: beside the rows' import

    chunks = PrefillPieces(model, prompt.history_ids, chunk_size=prefill_chunk or None)  # 0 or None: one pass
    for _ in chunks:
        yield "prefill_s"
    prefill = chunks.result
    selection = selector.select(prefill, prompt, budget)
    yield "selection_s"
    layers = relocate_selection(prefill, selection, condition, factors)
    batch = stack_rows([layers])
    yield "relocation_s"
    q = prompt.question_ids.numel()
    positions = layers.coordinates.question_positions(q)[None]  # [1, Q]
    source = (torch.arange(q) + prefill.history_length)[None]
    logits = forward_rows(model, batch, prompt.question_ids[None], positions, source)
    yield "question_s"
    result = GenerationResult(layers.coordinates.condition, layers.coordinates.question_start, positions[0],
                              logits[0, -1])
    for _ in decode_steps(model, batch, [result], logits[:, -1], positions[:, -1] + 1, source[:, -1] + 1,
                          DecodeSettings(max_new_tokens=new_tokens, eos_token_ids=set())):
        yield "generation_s"
    out.update(layers=layers, selection=selection, prefill=prefill, tokens=len(result.token_ids),
               token_ids=list(result.token_ids))
    yield "generation_s"


STAGES = ("prefill_s", "selection_s", "relocation_s", "question_s", "generation_s")


def timed_pieces(device, requests: list) -> list[dict]:
    """Run the piece generators of ``requests`` round robin, one piece of each per round, reversing the order every
    round (A B, B A, A B, ...: each request follows the other equally often); per request the summed wall and process
    CPU time of its pieces by stage (``request_s``, ``request_cpu_s``). CUDA is synchronised around every piece. With
    one request this is a plain back-to-back request."""
    times = [dict.fromkeys(STAGES, 0.0) | {"request_cpu_s": 0.0} for _ in requests]
    pending, backwards = list(range(len(requests))), False
    while pending:
        for index in (pending[::-1] if backwards else list(pending)):
            synchronize(device)
            start, cpu_start = time.perf_counter(), time.process_time()
            try:
                stage = next(requests[index])
            except StopIteration:
                pending.remove(index)
                continue
            synchronize(device)
            times[index][stage] += time.perf_counter() - start
            times[index]["request_cpu_s"] += time.process_time() - cpu_start
        backwards = not backwards
    for entry in times:
        entry["request_s"] = sum(entry[stage] for stage in STAGES)
    return times


def finish_request(times: dict, out: dict, device, memory: dict | None = None) -> dict:
    """A request's row: stage times, the float32 copy of its kept cache, kept KV bytes and memory peaks."""
    kept = [keys for keys, _ in out["layers"].data]  # [kv_head, slot, head_dim] per layer: the same cache, for the copy
    synchronize(device)
    copy_start = time.perf_counter()
    for keys in kept:
        keys.float().clone()
    synchronize(device)
    prefill = out["prefill"]
    return {**times, "float32_copy_s": time.perf_counter() - copy_start, "tokens": out["tokens"],
            "kv_logical_mb": kv_logical_bytes(out["selection"], prefill.keys[0].shape[-1],
                                              prefill.keys[0].dtype) / 2**20,
            **(memory or {})}


def complete_request(model, prompt, selector, budget, condition: str, factors, new_tokens: int,
                     prefill_chunk: int | None = None) -> dict:
    """One complete request on its own, with stage times (CUDA synchronised at each boundary) and memory peaks."""
    out = {}
    with MemoryProbe(model.device) as memory:
        (times,) = timed_pieces(model.device, [request_pieces(model, prompt, selector, budget, condition, factors,
                                                              new_tokens, out, prefill_chunk)])
    return finish_request(times, out, model.device, memory.peaks)


def timed_pair(model, prompt, selector, budget, conditions: tuple[str, str], factors, new_tokens: int,
               prefill_chunk: int | None = None) -> list[dict]:
    """The complete requests of two conditions interleaved piece by piece (prefill chunks, selection, relocation,
    question, then one decoding step of each in turn), so slow spells of the machine hit both alike; one row per
    condition, without memory peaks (both requests are alive at once)."""
    outs = [{}, {}]
    pieces = [request_pieces(model, prompt, selector, budget, c, factors, new_tokens, o, prefill_chunk)
              for c, o in zip(conditions, outs)]
    times = timed_pieces(model.device, pieces)
    return [finish_request(t, o, model.device) for t, o in zip(times, outs)]


SCHEDULES = ("interleaved", "back-to-back")


def steady_allocator() -> bool:
    """Make glibc keep freed memory in the process (no trimming, mmap only above 32 MiB), so repeated requests stop
    paying page faults that vary from run to run; False where the C library is not glibc. Timing only: memory peaks
    are measured before this is called."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # glibc's mallopt parameter numbers
    return all(mallopt(param, value) == 1 for param, value in (
        (m_trim_threshold, 2**31 - 1), (m_top_pad, 64 * 2**20), (m_mmap_threshold, 32 * 2**20)))


def parse_budgets(text) -> tuple[int | float, ...]:
    """``"2048,8192"`` -> ``(2048, 8192)`` (kept states per head), ``"0.1,0.2"`` -> ratios of the history; refuses
    anything else in one line (:class:`ValueError`).

    >>> parse_budgets("2048, 8192"), parse_budgets("0.1"), parse_budgets((256,))
    ((2048, 8192), (0.1,), (256,))
    """
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else list(text)
    budgets = []
    for item in items:
        if item == "":
            continue
        try:
            value = int(item) if isinstance(item, int) or str(item).isdigit() else float(item)
        except ValueError:
            value = None
        if value is None or isinstance(value, float) and not 0 < value <= 1 or isinstance(value, int) and value < 1:
            raise BudgetError(f"--budgets must be kept states per head (whole numbers >= 1, e.g. 2048,8192) or ratios "
                              f"of the history in (0, 1] (e.g. 0.1); got {item!r} in {text!r}. Fix: pass e.g. "
                              "--budgets 2048,8192 or --budgets 0.1")
        budgets.append(value)
    if not budgets:
        raise BudgetError(f"--budgets needs at least one budget (e.g. 2048,8192); got {text!r}. Fix: pass e.g. "
                          "--budgets 2048,8192")
    return tuple(budgets)


def parse_selectors(text) -> tuple[str, ...]:
    """``"bm25,snapkv,pyramidkv"`` -> names, each checked against the selector registry (one line otherwise)."""
    from relaylens.selectors import REGISTRY, is_selector_name  # noqa: PLC0415 - import cost

    names = tuple(s.strip() for s in text.split(",") if s.strip()) if isinstance(text, str) else tuple(text)
    if not names or not all(is_selector_name(n) for n in names):
        raise RelaylensError(f"--selectors must name selectors of {sorted(REGISTRY)} separated by commas; got "
                             f"{text!r}. Fix: pass e.g. --selectors snapkv,pyramidkv")
    return names


def stratified_prompts(tokenizer, count: int, data=None):
    """Completion-mode prompts of ``count`` records: the bundled sample's first (``data`` None), or, from ``data``, the
    records spread evenly over the history-length order (shortest, ..., longest: Table 3's records stratified by
    history length)."""
    if data is None:
        return sample_prompts(tokenizer, count)
    from relaylens.datasets import load_records, resolve_data  # noqa: PLC0415 - import cost
    from relaylens.datasets.prompting import render_prompt  # noqa: PLC0415 - import cost

    prompts = [render_prompt(record, tokenizer, mode="completion") for record in load_records(resolve_data(data))]
    if not prompts:
        raise RelaylensError(f"{data} holds no records. Fix: pass --data a records file with at least one record")
    ordered = sorted(prompts, key=lambda p: p.history_length)
    if count >= len(ordered):
        return ordered
    picks = sorted({round(i * (len(ordered) - 1) / max(count - 1, 1)) for i in range(count)})
    return [ordered[i] for i in picks]


def run_overhead(repeats: int = 3, records: int = 4, model_spec: str = DEFAULT_MODEL, new_tokens: int = 128,
                 selectors=OVERHEAD_SELECTORS, budgets=CPU_BUDGETS, load_kwargs: dict | None = None,
                 schedule: str = "interleaved", prefill_chunk: int | None = 256, data=None, **_) -> list[dict]:
    """Table 3: per (selector, budget) the relay-vs-original overhead of complete requests, on the bundled sample or
    on ``data`` (records stratified by history length, :func:`stratified_prompts`); ``selectors`` and ``budgets``
    take lists or comma-separated text (``"bm25,snapkv,pyramidkv"``, ``"2048,8192"``: the paper's protocol with
    ``new_tokens=128``, ``repeats=3``). Rows carry each record's history length (``history_tokens``).

    ``schedule="interleaved"`` (default) runs each repetition's two requests piece by piece in turn (prefill chunks of
    ``prefill_chunk`` tokens, selection, relocation, question, then one decoding step each), and times every piece,
    so the machine's slow spells (on a shared VM the same work varies by 10-20% within seconds) hit both conditions
    alike; memory peaks then come from one back-to-back request per condition on the first record, run first.
    ``"back-to-back"`` runs each request whole and measures its peaks itself.
    """
    if schedule not in SCHEDULES:
        raise RelaylensError(f"schedule must be one of {SCHEDULES}; got {schedule!r}. Fix: pass one of those")
    selectors, budgets = parse_selectors(selectors), parse_budgets(budgets)
    model, tokenizer = load_bench_model(model_spec, load_kwargs)
    factors = RotaryFactors.from_model(model)
    prompts = stratified_prompts(tokenizer, records, data)
    for prompt in prompts:  # before any timing: a budget the history cannot fill, a history past the rotary range
        too_big = [b for b in budgets if isinstance(b, int) and b > prompt.history_length]
        if too_big:
            raise BudgetError(f"budget {too_big[0]} exceeds record {prompt.record_id}'s history of "
                              f"{prompt.history_length} tokens. Fix: smaller --budgets, or --data with longer "
                              "histories")
        needed = prompt.history_length + prompt.question_ids.numel() + new_tokens
        if factors.max_position and needed > factors.max_position:
            raise PositionError(f"record {prompt.record_id} needs {needed} positions (history, question, "
                                f"{new_tokens} steps), past the model's rotary range of {factors.max_position}. Fix: "
                                "shorter records or a model with a longer context (--max-position with --rope-scaling)")
    chosen = {name: make_selector(name) for name in selectors}
    settings = [(name, budget) for name in chosen for budget in budgets]
    interleaved = schedule == "interleaved"
    bar = _request_bar(len(settings) * (len(prompts) * repeats + interleaved) * 2)
    complete_request(model, prompts[0], chosen[selectors[0]], budgets[0], "relay", factors, 4, prefill_chunk)  # warm-up
    peaks = {}
    if interleaved:  # the memory pass, before the allocator keeps freed memory
        for name, budget in settings:
            for condition in ("original", "relay"):
                row = complete_request(model, prompts[0], chosen[name], budget, condition, factors, new_tokens,
                                       prefill_chunk)
                peaks[name, budget, condition] = {k: v for k, v in row.items() if k.startswith("peak_")}
                bar(f"memory: {name} @ {budget}, {condition}")
    allocator = "glibc, freed memory kept" if steady_allocator() else "default"
    rows, per_record = [], []
    for name, budget in settings:
        selector, ratios, cpu_ratios, setting_rows = chosen[name], [], [], []
        for index, prompt in enumerate(prompts):
            runs = {"original": [], "relay": []}
            for rep in range(repeats):
                order = ("original", "relay") if rep % 2 == 0 else ("relay", "original")
                if interleaved:
                    pair = timed_pair(model, prompt, selector, budget, order, factors, new_tokens, prefill_chunk)
                else:
                    pair = [complete_request(model, prompt, selector, budget, c, factors, new_tokens, prefill_chunk)
                            for c in order]
                for condition, row in zip(order, pair):
                    runs[condition].append(row)
                    bar(f"{name} @ {budget}, {prompt.record_id}, {condition}")
            medians = {c: {k: statistics.median(r[k] for r in reps) for k in reps[0] if isinstance(reps[0][k],
                                                                                                   (int, float))}
                       for c, reps in runs.items()}
            if interleaved and index == 0:
                for condition in medians:
                    medians[condition].update(peaks[name, budget, condition])
            ratios.append(medians["relay"]["request_s"] / medians["original"]["request_s"])
            cpu_ratios.append(medians["relay"]["request_cpu_s"] / medians["original"]["request_cpu_s"])
            for condition, values in medians.items():
                setting_rows.append({"benchmark": "overhead", "case": f"{prompt.record_id} (L={prompt.history_length})",
                                     "history_tokens": prompt.history_length, "selector": name, "budget": budget,
                                     "condition": condition, **values,
                                     "ratio_vs_original": values["request_s"] / medians["original"]["request_s"]})
        per_record += setting_rows
        relay = [r for r in setting_rows if r["condition"] == "relay"]
        original = [r for r in setting_rows if r["condition"] == "original"]
        rows.append({"benchmark": "overhead", "case": "geometric mean", "selector": name, "budget": budget,
                     "records": len(ratios), "overhead_pct": 100 * geometric_mean_minus_one(ratios),
                     "overhead_cpu_pct": 100 * geometric_mean_minus_one(cpu_ratios),  # the same statistic on CPU time
                     "relocation_ms_original": 1e3 * statistics.fmean(r["relocation_s"] for r in original),
                     "relocation_ms_relay": 1e3 * statistics.fmean(r["relocation_s"] for r in relay),
                     "float32_copy_ms": 1e3 * statistics.fmean(r["float32_copy_s"] for r in relay),
                     "request_s_original": statistics.fmean(r["request_s"] for r in original),
                     "request_s_relay": statistics.fmean(r["request_s"] for r in relay),
                     "kv_logical_mb": statistics.fmean(r["kv_logical_mb"] for r in relay),
                     "schedule": schedule, "prefill_chunk": prefill_chunk or 0, "allocator": allocator,
                     "target": "<= +1.0% (paper: +1.34% to +2.70%)"})
    bar(None)
    return per_record + rows


def _request_bar(total: int):
    """A progress bar on stderr for ``total`` requests: call it with a label after each request, with None to close."""
    from rich.console import Console  # noqa: PLC0415 - import cost: rich loads on first use

    view = progress_view(Console(stderr=True))
    task = view.add_task("overhead", total=total, stage="")
    view.start()

    def advance(label: str | None) -> None:
        if label is None:
            view.stop()
            return
        view.update(task, advance=1, stage=label)

    return advance


def run_throughput(repeats: int = 1, model_spec: str = DEFAULT_MODEL, new_tokens: int = 128, record: int = 0,
                   counts=ROW_COUNTS, compare=COMPARED_COUNTS, selectors=("snapkv", "pyramidkv", "bm25"),
                   load_kwargs: dict | None = None, **_) -> list[dict]:
    """One record's rows one by one vs in one batch (``compare``: 5, 9 and 12 rows — a coordinate ablation, an
    ordering experiment, the main table), then the batched wall time for ``counts`` rows. Rows are taken in turn from
    ``selectors`` (at 10% of the history) x 5 conditions sharing the record's prefill (15 rows by default); every
    comparison also says whether both ways decoded the same tokens."""
    from relaylens.generation.rows import Row, run_rows  # noqa: PLC0415 - import cost: transformers loads on first use
    from relaylens.generation.single import run_condition  # noqa: PLC0415 - import cost: transformers loads on first use

    model, tokenizer = load_bench_model(model_spec, load_kwargs)
    factors = RotaryFactors.from_model(model)
    prompt = sample_prompts(tokenizer, record + 1)[record]
    prefill = prefill_history(model, prompt.history_ids)
    selections = [make_selector(name).select(prefill, prompt, 0.1) for name in selectors]
    conditions = ("original", "key_only", "relay", "query_only(2048)", "common_shift(2048)")  # coordinate_ablation
    pool = [(sel, cond) for sel in selections for cond in conditions]  # selectors x conditions
    common = dict(max_new_tokens=new_tokens, factors=factors, eos_token_ids=set())
    run_rows(model, prefill, [Row(*pool[0])], prompt.question_ids, **{**common, "max_new_tokens": 2})  # warm-up

    def chosen(count: int) -> list:
        return pool[:count] if count <= len(pool) else (pool * (count // len(pool) + 1))[:count]

    def sequential(rows):
        return [run_condition(model, prefill, sel, cond, prompt.question_ids, **common) for sel, cond in rows]

    def batched(rows):
        return run_rows(model, prefill, [Row(sel, cond) for sel, cond in rows], prompt.question_ids, **common)

    results = []
    for count in compare:
        rows, seq_s, bat_s, same = chosen(count), [], [], True
        for _ in range(repeats):
            start = time.perf_counter()
            one_by_one = sequential(rows)
            seq_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            together = batched(rows)
            bat_s.append(time.perf_counter() - start)
            same &= [r.token_ids for r in one_by_one] == [r.token_ids for r in together]
        tokens = count * new_tokens
        seq, bat = statistics.median(seq_s), statistics.median(bat_s)
        results.append({"benchmark": "throughput", "case": f"{prompt.record_id}: {count} rows x {new_tokens} tokens",
                        "rows": count, "sequential_s": seq, "batched_s": bat, "speedup": seq / bat,
                        "sequential_tok_s": tokens / seq, "batched_tok_s": tokens / bat, "same_tokens": bool(same),
                        "target": ">= 2.5x" if count == 5 else ""})
    for count in counts:
        wall = statistics.median(_timed_run(lambda rows=chosen(count): batched(rows)) for _ in range(repeats))
        results.append({"benchmark": "throughput", "case": f"{count} rows batched", "rows": count, "batched_s": wall,
                        "batched_tok_s": count * new_tokens / wall, "s_per_row": wall / count})
    return results


def _timed_run(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
