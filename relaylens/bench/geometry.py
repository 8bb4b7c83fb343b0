"""Benchmarks (not tests): ``relaylens bench geometry`` and friends. Ratios are measured within one run.

Example:
    $ relaylens bench geometry --out runs/bench
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from relaylens.geometry import fused as kernels
from relaylens.geometry.rotary import RotaryFactors, multiply_planes, relocate_keys, rotate_keys


@dataclass(frozen=True)
class CacheShape:
    """A cache geometry to benchmark: ``[layer, kv_head, slot, head_dim]`` plus the rotary it uses."""

    name: str
    layers: int
    kv_heads: int
    slots: int
    head_dim: int
    rope_parameters: dict
    history_length: int


SMOLLM2 = CacheShape("SmolLM2-135M (30x3x410x64)", 30, 3, 410, 64, {"rope_type": "default", "rope_theta": 100000.0},
                     4100)
"""The SmolLM2-sized cache of the small relocation benchmark (30 layers x 3 kv heads x 410 states x 64)."""
LLAMA31_8B = CacheShape(
    "Llama-3.1-8B (32x8x12800x128)",
    32,
    8,
    12800,
    128,
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192, "rope_theta": 500000.0},
    128000,
)
"""The Llama-3.1-8B-sized cache of the large relocation benchmark (32 layers x 8 kv heads x 12,800 states x 128)."""


def rotary_only_model(head_dim: int, rope_parameters: dict, max_position: int = 131072 + 1):
    """A one-layer random Llama whose rotary embedding matches ``head_dim`` / ``rope_parameters``."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - import cost: transformers loads on first use

    config = LlamaConfig(
        vocab_size=8, hidden_size=2 * head_dim, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=head_dim, max_position_embeddings=max_position,
        rope_parameters=dict(rope_parameters),
    )
    return LlamaForCausalLM(config).eval()


def interleaved_medians(first: Callable[[], object], second: Callable[[], object], repeats: int = 5) -> tuple[float,
                                                                                                              float]:
    """Median wall seconds of ``first`` and ``second`` timed alternately (one warm-up each): a slow spell of a shared
    machine then hits both, so their ratio stays meaningful."""
    first(), second()
    times: tuple[list, list] = ([], [])
    for _ in range(repeats):
        for fn, bucket in zip((first, second), times):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def min_cpu_seconds(fn: Callable[[], object], repeats: int = 5) -> float:
    """Smallest process CPU time of ``repeats`` calls: robust to other processes taking the cores (a shared machine)."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def bench_relocation(shape: CacheShape, repeats: int = 5, seed: int = 0, fused: bool = True,
                     dtype: torch.dtype = torch.float32) -> dict:
    """Relocation time of a whole cache to RoPERelay slots vs a plain copy of the same key tensor (same dtype).

    ``fused``: the fused CPU kernel (:mod:`relaylens.geometry.fused`, the default path) or the eager PyTorch path.
    ``dtype``: the cache dtype (bfloat16: relocation computes in float32 and rounds back, compared with a bfloat16
    copy).
    """

    factors = RotaryFactors.from_model(rotary_only_model(shape.head_dim, shape.rope_parameters))
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(shape.layers, shape.kv_heads, shape.slots, shape.head_dim,
                       generator=generator).to(dtype)  # [layer, kv_head, slot, head_dim]
    noise = torch.rand(shape.layers, shape.kv_heads, shape.history_length, generator=generator)
    source = noise.topk(shape.slots, dim=-1).indices.sort(dim=-1).values  # [layer, kv_head, slot]
    target = torch.arange(shape.slots).expand_as(source)  # relay slots (uniform counts: M - m + i = i)
    with contextlib.nullcontext() if fused else kernels.disabled():
        path = "fused" if kernels.usable(keys, factors.rotary_dim) else "eager"
        relocate = lambda: relocate_keys(keys, source, target, factors)  # noqa: E731
        relocate()  # compile / load the kernel outside the timings
        copy_s, relocate_s = interleaved_medians(lambda: keys.clone(), relocate, repeats)
        copy_cpu = min_cpu_seconds(lambda: keys.clone(), repeats)
        relocate_cpu = min_cpu_seconds(relocate, repeats)
    return {
        "benchmark": "relocation",
        "case": shape.name,
        "dtype": str(dtype).removeprefix("torch."),
        "path": path,
        "threads": torch.get_num_threads(),
        "parallel": kernels.parallel_backend() if path == "fused" else "pytorch",
        "relocate_ms": relocate_s * 1e3,
        "copy_ms": copy_s * 1e3,
        "ratio": relocate_s / copy_s,
        "relocate_cpu_ms": relocate_cpu * 1e3,
        "copy_cpu_ms": copy_cpu * 1e3,
        "cpu_ratio": relocate_cpu / copy_cpu,
        "target": "<= 3",
    }


def bench_delta_rotation_error(rope_name: str, rope_parameters: dict, head_dim: int = 64, max_position: int = 131072,
                               n: int = 4096, seed: int = 0) -> dict:
    """Max abs error against direct rotation at p' for the two-step form and a single delta rotation R(p'-p)."""
    factors = RotaryFactors.from_model(rotary_only_model(head_dim, rope_parameters, max_position + 1))
    generator = torch.Generator().manual_seed(seed)
    content = torch.randn(n, head_dim, generator=generator)  # un-rotated key content [n, head_dim]
    source = torch.randint(max_position // 2, max_position, (n,), generator=generator)
    target = torch.randint(0, max_position // 64, (n,), generator=generator)
    cached = rotate_keys(content, source, factors)  # what the model cached at p
    direct = rotate_keys(content, target, factors)  # the reference: the model rotating the content at p'
    two_step = relocate_keys(cached, source, target, factors)
    # peer method: one rotation by the delta (p' - p), taken from the same rotary embedding (kvpress-style)
    delta = target - source
    cos_d, sin_d = factors.plane_factors(delta.abs())
    sign = torch.sign(delta).float()[:, None]
    amplitude = (cos_d * cos_d + sin_d * sin_d).sqrt()

    single = cached.clone()
    delta_phase = torch.complex(cos_d / amplitude, sign * sin_d / amplitude)  # e^{i phi(p' - p)}, unit amplitude
    single[:, : factors.rotary_dim] = multiply_planes(cached[:, : factors.rotary_dim], delta_phase, factors.layout)
    return {
        "benchmark": "accuracy",
        "case": f"{rope_name}, p up to {max_position:,}",
        "two_step_max_abs_error": float((two_step - direct).abs().max()),
        "delta_rotation_max_abs_error": float((single - direct).abs().max()),
        "max_abs_key": float(direct.abs().max()),
    }


def run_geometry(repeats: int = 5, include_large: bool = True) -> list[dict]:
    """``relaylens bench geometry``: relocation against a float32 copy (fused kernel and eager path, float32 and
    bfloat16 keys, SmolLM2- and Llama-3.1-8B-sized caches) and the error of two-step relocation against direct
    rotation; one row each."""
    bf16 = torch.bfloat16
    rows = [bench_relocation(SMOLLM2, repeats), bench_relocation(SMOLLM2, repeats, fused=False),
            bench_relocation(SMOLLM2, repeats, dtype=bf16), bench_relocation(SMOLLM2, repeats, fused=False, dtype=bf16)]
    if include_large:
        large = max(3, repeats // 2)
        rows.append(bench_relocation(LLAMA31_8B, repeats=large))
        rows.append(bench_relocation(LLAMA31_8B, repeats=large, fused=False))
        rows.append(bench_relocation(LLAMA31_8B, repeats=large, dtype=bf16))
        rows.append(bench_relocation(LLAMA31_8B, repeats=large, fused=False, dtype=bf16))
    rows.append(bench_delta_rotation_error("default (theta 1e4)", {"rope_type": "default", "rope_theta": 10000.0}))
    rows.append(bench_delta_rotation_error(
        "yarn factor 4",
        {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "original_max_position_embeddings": 32768}))
    return rows


def write_results(rows: list[dict], out_dir: Path, name: str) -> tuple[Path, Path]:
    """Write rows to ``<out>/<name>.csv`` and ``<out>/<name>.md`` (atomically) and return both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    csv_path, md_path = out_dir / f"{name}.csv", out_dir / f"{name}.md"
    for path, text in ((csv_path, frame.to_csv(index=False)), (md_path, _markdown(frame))):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return csv_path, md_path


def _markdown(frame) -> str:
    columns = list(frame.columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, row in frame.iterrows():
        cells = [f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v)) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
