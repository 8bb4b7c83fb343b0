"""``relaylens bench roofline`` (not a test): this machine's limits, and each stage of a record as a fraction of them.

Why: a stage time says little until it sits beside what the machine can do. One run measures the limits and the
stages, so the fractions compare numbers taken minutes apart on the same machine.

Limits (section ``limit``): ``F.linear`` throughput in float32 and bfloat16 (and the model's dtype) at the model's
shapes (qkv, o, MLP up and down, lm_head) with 1, 5 and 12 rows (decoding batches) and 2,048 rows (prefill; lm_head
only at decoding rows, since a prefill keeps one logit row); per dtype the FLOP-weighted rate of one decoder layer's
mix at prefill rows (``gemm mix``), which is the compute limit; and the copy bandwidth (bytes read + written / s).

Stages (section ``stage``, the model in its loaded dtype): prefill at ``lengths`` tokens (chunks of 2,048, as runs);
relocation of a ``cache_tokens``-token kept cache (every key moves); the question pass (batch 1); one decoding step
with relaylens's batched rows and one plain transformers step with a ``DynamicCache`` of the same keys, at each
batch, steps interleaved. Each stage's floor is ``max(FLOPs / gemm mix, bytes / bandwidth)``, bytes being the
weights read once per forward (relocation: its keys and values read and written); ``fraction = floor / time``
(1 = on the roofline) and ``bound`` names the larger term. ``tokens`` is the prefill length or the cached context;
``cache_mb`` the KV a decoding step reads besides the weights; ``attention_share`` the attention part of the FLOPs.
Every row names the CPU, its flags, torch's threads and the cores the process may use.

Example:
    $ relaylens bench roofline --model smollm2-135m-instruct --dtype bfloat16 --lengths 2048,8192
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from relaylens.bench.machine import (
    LAYER_MIX,
    ModelCost,
    call_times,
    copy_bandwidth,
    cores,
    cpu_info,
    flop_weighted,
    gemm,
    linear_shapes,
    synchronize,
)
from relaylens.bench.model import load_bench_model
from relaylens.errors import PositionError, RelaylensError
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.model.catalogue import DEFAULT_MODEL
from relaylens.model.hf import cache_from_tensors
from relaylens.model.prefill import prefill_history

GEMM_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Sizes:
    """What one run measures; :data:`FULL` by default, :data:`QUICK` for tests (seconds on a tiny model)."""

    lengths: tuple[int, ...] = (2048, 8192, 16384)  # prefill tokens
    chunk: int = 2048  # prefill chunk
    cache_tokens: int = 2048  # kept cache of the decoding steps
    shift: int = 16  # history tokens dropped before the kept ones: every key moves when relocated
    batches: tuple[int, ...] = (1, 5, 12)
    prefill_rows: int = 2048  # GEMM rows of the compute limit
    question_tokens: int = 32
    steps: int = 5  # timed decoding steps per batch (after one warm-up step)
    copy_mib: int = 256
    repeats: int = 3


FULL = Sizes()
QUICK = Sizes(lengths=(24, 40), chunk=16, cache_tokens=32, shift=4, batches=(1, 2), prefill_rows=64,
              question_tokens=4, steps=2, copy_mib=4, repeats=2)


def parse_lengths(text) -> tuple[int, ...]:
    """``"2048,8192"`` (or a sequence) -> ``(2048, 8192)``; refuses anything but positive whole numbers."""
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else list(text)
    try:
        lengths = tuple(int(s) for s in items if s != "")
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 1:
        raise RelaylensError(f"--lengths must be positive token counts separated by commas (e.g. 2048,8192); got "
                             f"{text!r}. Fix: pass whole numbers >= 1, e.g. --lengths 2048,8192")
    if max(lengths) > LENGTH_LIMIT:
        raise PositionError(f"--lengths {max(lengths):,} is past {LENGTH_LIMIT:,} tokens (2**24, where rotary "
                            "positions stop being distinct; and far past any model's range). Fix: lengths within the "
                            "model's max_position_embeddings, e.g. 2048,8192")
    return lengths


LENGTH_LIMIT = 2**24  # no rotary model tells positions apart past it (relaylens.geometry.positions)


def check_lengths(lengths, model) -> None:
    """Refuse prefill lengths past the loaded model's rotary range, before any measurement."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit and max(lengths) > limit:
        raise PositionError(f"--lengths {max(lengths):,} is past the model's rotary range (max_position_embeddings="
                            f"{limit:,}). Fix: lengths up to {limit:,}, or --rope-scaling with --max-position")


def run_roofline(model_spec: str = DEFAULT_MODEL, load_kwargs: dict | None = None, quick: bool = False,
                 lengths=None, repeats: int | None = None, model=None, **_) -> list[dict]:
    """The rows of the module's table. ``model``: an already loaded model (else ``model_spec`` with ``load_kwargs``);
    ``quick``: :data:`QUICK` sizes; ``lengths`` (``"2048,8192"``) and ``repeats`` override the sizes."""
    sizes = QUICK if quick else FULL
    sizes = replace(sizes, **({"lengths": parse_lengths(lengths)} if lengths else {}),
                    **({"repeats": int(repeats)} if repeats else {}))
    name = str(getattr(model, "name_or_path", "") or "given model") if model is not None else model_spec
    if model is None:
        model, _ = load_bench_model(model_spec, load_kwargs)
    check_lengths(sizes.lengths, model)
    cpu, cost = cpu_info(), ModelCost.of(model)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    common = {"cpu": cpu.model, "flags": cpu.flag_text(), "threads": cpu.threads, "cores": cores(),
              "model": name[-40:]}
    limits, peaks, bandwidth = measure_limits(model, sizes, dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    floor = {"dtype": dtype, "section": "limit", "case": f"decoding floor: {weight_bytes / 1e9:.3g} GB of weights / "
             "copy bandwidth (one batch-1 step reads every weight once)", "time_ms": 1e3 * weight_bytes / (
                 bandwidth * 1e9), "gb_s": bandwidth, "device": str(model.device)}
    stages = measure_stages(model, cost, sizes, peaks[dtype], bandwidth)
    return [{**common, **row} for row in [*limits, floor, *stages]]


def measure_limits(model, sizes: Sizes, model_dtype: str) -> tuple[list[dict], dict[str, float], float]:
    """Limit rows, the compute limit per dtype (GFLOP/s of the layer mix at prefill rows) and the bandwidth (GB/s)."""
    device, rows, peaks = model.device, [], {}
    shapes = linear_shapes(model.config)
    for dtype in dict.fromkeys((*GEMM_DTYPES, model_dtype)):
        at_prefill = {}
        for batch in (*sizes.batches, sizes.prefill_rows):
            for name, (k, n) in shapes.items():
                if name == "lm_head" and batch == sizes.prefill_rows:
                    continue
                rate = gemm(batch, k, n, getattr(torch, dtype), sizes.repeats, device)
                if batch == sizes.prefill_rows:
                    at_prefill[name] = rate
                rows.append({"dtype": dtype, "section": "limit", "case": f"gemm {name} {batch}x{k} by {k}x{n}",
                             "batch": batch, "time_ms": 1e3 * rate["time_s"], "gflop_s": rate["gflop_s"],
                             "gb_s": rate["weight_gb_s"]})
        peaks[dtype] = flop_weighted(at_prefill)
        mix = " + ".join(f"{count} {name}" if count > 1 else name for name, count in LAYER_MIX.items())
        rows.append({"dtype": dtype, "section": "limit", "case": f"gemm mix ({mix}), {sizes.prefill_rows} rows",
                     "batch": sizes.prefill_rows, "gflop_s": peaks[dtype]})
    copy = copy_bandwidth(sizes.copy_mib, sizes.repeats, device)
    rows.append({"dtype": "float32", "section": "limit", "case": f"copy {sizes.copy_mib} MiB (read + written)",
                 "time_ms": 1e3 * copy["time_s"], "gb_s": copy["gb_s"]})
    return rows, peaks, copy["gb_s"]


def stage_row(name: str, seconds: float, flops: float, moved: float, peak_gflop_s: float, gb_s: float, **extra) -> dict:
    """One stage as a fraction of the roofline: floor = max(flops / peak, bytes / bandwidth)."""
    compute, memory = flops / (peak_gflop_s * 1e9), moved / (gb_s * 1e9)
    floor = max(compute, memory)
    return {"section": "stage", "case": name, "time_ms": 1e3 * seconds,
            "gflop_s": flops / seconds / 1e9 if flops else None, "gb_s": moved / seconds / 1e9,
            "limit_gflop_s": peak_gflop_s, "limit_gb_s": gb_s, "floor_ms": 1e3 * floor,
            "fraction": floor / seconds, "bound": "compute" if compute >= memory else "memory", **extra}


def measure_stages(model, cost: ModelCost, sizes: Sizes, peak: float, bandwidth: float) -> list[dict]:
    """Prefill, relocation, question pass and decoding steps (relaylens rows and plain transformers) as stage rows."""
    from relaylens.generation.cache import relocate_selection  # noqa: PLC0415 - import cost: transformers loads on first use
    from relaylens.generation.rows import forward_rows, stack_rows  # noqa: PLC0415 - import cost: transformers loads on first use

    device, dtype = model.device, str(next(model.parameters()).dtype).removeprefix("torch.")
    vocab = model.get_input_embeddings().num_embeddings
    limit = getattr(model.config, "max_position_embeddings", None)
    generator = torch.Generator().manual_seed(0)
    tokens = lambda n: torch.randint(min(100, vocab // 4), min(20000, vocab), (n,), generator=generator)  # noqa: E731
    prefill = lambda ids: prefill_history(model, ids, window_size=min(32, ids.numel()),  # noqa: E731 (as runs)
                                          chunk_size=sizes.chunk, allow_long=limit is not None and ids.numel() > limit)
    roof = dict(peak_gflop_s=peak, gb_s=bandwidth, dtype=dtype)
    rows = []
    prefill(tokens(min(256, min(sizes.lengths))))  # warm-up: kernels, allocator
    for length in sizes.lengths:
        ids = tokens(length)
        seconds = call_times(lambda: prefill(ids), 1, device, warmup=0)[0]  # once: a 16k prefill takes minutes
        chunks = -(-length // sizes.chunk)
        flops = cost.forward_flops(length, logits=chunks)
        rows.append(stage_row(f"prefill {length} tokens", seconds, flops, chunks * cost.weight_bytes, **roof,
                              tokens=length, batch=1, tokens_s=length / seconds,
                              attention_share=cost.attention_flops(length, 0) / flops))
    # a kept cache of cache_tokens states: the history minus its first `shift` tokens, so relay moves every key
    history, kept = sizes.cache_tokens + sizes.shift, sizes.cache_tokens
    pre = prefill(tokens(history))
    positions = torch.arange(sizes.shift, history).expand(cost.layers, cost.kv_heads, kept)  # [layer, kv_head, slot]
    selection = Selection(positions.clone(), torch.ones(positions.shape, dtype=torch.bool), history)
    factors = RotaryFactors.from_model(model)
    relocate = lambda: relocate_selection(pre, selection, "relay", factors)  # noqa: E731
    seconds = statistics.median(call_times(relocate, sizes.repeats, device))
    rows.append(stage_row(f"relocation of {kept} kept states", seconds, 0, 2 * cost.kv_bytes(kept), **roof,
                          tokens=kept, batch=1))
    layers = relocate()
    q = sizes.question_tokens
    question = tokens(q)[None]  # [1, Q]
    start = layers.coordinates.question_start
    times = []
    for _ in range(sizes.repeats + 1):
        batch = stack_rows([layers])
        times += call_times(lambda: forward_rows(model, batch, question, torch.arange(start, start + q)[None],
                                                 torch.arange(history, history + q)[None]), 1, device, warmup=0)
    rows.append(stage_row(f"question pass {q} tokens", statistics.median(times[1:]),
                          cost.forward_flops(q, kept), cost.weight_bytes, **roof, tokens=kept, batch=1))
    for width in sizes.batches:
        ours, plain = decode_times(model, layers, pre, sizes, width, start, history)
        flops = cost.forward_flops(1, kept, batch=width)
        extra = dict(tokens=kept, batch=width, cache_mb=cost.kv_bytes(kept, width) / 2**20,
                     attention_share=cost.attention_flops(1, kept, width) / flops)
        rows.append(stage_row(f"decode step, batch {width} (relaylens rows)", ours, flops, cost.weight_bytes, **roof,
                              **extra, vs_plain=ours / plain))
        rows.append(stage_row(f"decode step, batch {width} (transformers DynamicCache)", plain, flops,
                              cost.weight_bytes, **roof, **extra))
    return rows


def decode_times(model, layers, pre, sizes: Sizes, width: int, start: int, history: int) -> tuple[float, float]:
    """Median seconds of one decoding step at batch ``width``: relaylens rows (``layers``, the relocated kept cache)
    and plain transformers (a ``DynamicCache`` of the same kept states of ``pre``), alternating step by step after
    one warm-up step each. Both start from token 0 in every row and continue greedily."""
    from relaylens.generation.rows import GenerationResult, decode_steps, stack_rows  # noqa: PLC0415 - import cost: transformers loads on first use
    from relaylens.generation.settings import DecodeSettings  # noqa: PLC0415 - import cost: beside the rows' import

    device, vocab = model.device, model.get_input_embeddings().num_embeddings
    batch = stack_rows([layers] * width)
    results = [GenerationResult("relay", start, torch.arange(1), torch.zeros(vocab)) for _ in range(width)]
    steps = decode_steps(model, batch, results, torch.zeros(width, vocab), torch.full((width,), start),
                         torch.full((width,), history), DecodeSettings(max_new_tokens=sizes.steps + 2,
                                                                       eos_token_ids=set()))
    shift = sizes.shift
    cache = cache_from_tensors([(k[None, :, shift:].expand(width, -1, -1, -1).contiguous(),
                                 v[None, :, shift:].expand(width, -1, -1, -1).contiguous())
                                for k, v in zip(pre.keys, pre.values)])  # per layer [row, kv_head, slot, head_dim]
    token, position = torch.zeros(width, 1, dtype=torch.long), history

    def plain_step():
        nonlocal token, position
        with torch.inference_mode():
            out = model(input_ids=token.to(device), position_ids=torch.full((width, 1), position, device=device),
                        cache=cache, use_cache=True, logits_to_keep=1)
        token, position = out.logits[:, -1].argmax(-1, keepdim=True).cpu(), position + 1

    ours, plain = [], []
    for _ in range(sizes.steps + 1):
        ours += call_times(lambda: next(steps), 1, device, warmup=0)
        plain += call_times(plain_step, 1, device, warmup=0)
    synchronize(device)
    return statistics.median(ours[1:]), statistics.median(plain[1:])


COLUMNS = (("dtype", "dtype"), ("case", "case"), ("time_ms", "ms"), ("gflop_s", "GFLOP/s"), ("gb_s", "GB/s"),
           ("floor_ms", "floor ms"), ("fraction", "fraction"), ("bound", "bound"), ("cache_mb", "KV MB"),
           ("attention_share", "attention"), ("vs_plain", "vs plain"))
MACHINE = ("cpu", "flags", "threads", "cores", "model")


def write_outputs(rows: list[dict], out_dir: Path) -> tuple[Path, Path]:
    """``<out>/roofline.md`` (the machine named above a table of :data:`COLUMNS`) and ``<out>/roofline.json`` (the
    machine and every row), written atomically beside the CSV of :func:`relaylens.bench.geometry.write_results`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = {k: rows[0].get(k) for k in MACHINE} if rows else {}
    lines = [f"**{machine.get('model')}** on **{machine.get('cpu')}** ({machine.get('flags')}; "
             f"{machine.get('threads')} torch threads, {machine.get('cores')} cores)", "",
             "| " + " | ".join(header for _, header in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(row.get(key)) for key, _ in COLUMNS) + " |" for row in rows]
    paths = out_dir / "roofline.md", out_dir / "roofline.json"
    texts = "\n".join(lines) + "\n", json.dumps({"machine": machine, "rows": rows}, indent=1, default=str)
    for path, text in zip(paths, texts):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return paths


def table(rows: list[dict]):
    """The rows as a rich table, titled with the CPU, its flags, threads and the model."""
    from rich.table import Table  # noqa: PLC0415 - import cost: rich loads on first use

    first = rows[0] if rows else {}
    grid = Table(title=f"roofline: {first.get('model', '')} on {first.get('cpu', '?')} [{first.get('flags', '')}], "
                       f"{first.get('threads', '?')} threads / {first.get('cores', '?')} cores")
    for _, header in COLUMNS:
        grid.add_column(header, justify="left" if header in ("dtype", "case", "bound") else "right")
    for row in rows:
        grid.add_row(*[_cell(row.get(key)) for key, _ in COLUMNS])
    return grid


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return f"{value:.3g}" if isinstance(value, float) else str(value)
