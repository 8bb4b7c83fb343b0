"""This machine's limits and a model's cost per token: what every timing of issue 40 is judged against.

Why: a timing without the machine's own limits beside it cannot be judged. A decoding step reads every weight once,
so its floor is weight bytes / memory bandwidth; a prefill is matrix products, so its floor is FLOPs / GEMM FLOP/s.
Both limits differ by machine and by dtype (issue 40: on an EPYC without AMX a bfloat16 matrix-vector product was
~12x slower than float32 and a 2,048-row bfloat16 GEMM ~3.7x faster), so they are measured, not read off CPU flags.

* :func:`cpu_info` / :func:`parse_cpuinfo`: CPU model name, AMX-BF16 / AVX512-BF16 / AVX512F, torch threads.
* :func:`gemm` / :func:`linear_shapes`: ``F.linear`` throughput (the kernel ``nn.Linear`` calls) at a model's shapes.
* :func:`copy_bandwidth`: a large tensor copy, bytes read + written per second.
* :class:`ModelCost`: linear and attention FLOPs, weight bytes read per forward, KV-cache bytes.

Example:
    >>> info = parse_cpuinfo("model name\\t: AMD EPYC 9R14\\nflags\\t\\t: fpu avx512f avx512_bf16\\n", threads=2)
    >>> info.model, info.flags
    ('AMD EPYC 9R14', {'AMX-BF16': False, 'AVX512-BF16': True, 'AVX512F': True})
    >>> info.describe()
    'AMD EPYC 9R14 (AVX512-BF16 AVX512F, no AMX-BF16; 2 torch threads)'
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from relaylens.bench.requests import synchronize
from relaylens.model.hf import decoder_layers
from relaylens.model.placement import cpu_model_name

#: ``/proc/cpuinfo`` flag -> the name the tables print.
CPU_FLAGS = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16", "avx512f": "AVX512F"}
#: Linear products of one decoder layer, by :func:`linear_shapes` name, and how often each runs (gate and up: 2).
LAYER_MIX = {"qkv": 1, "o": 1, "mlp_up": 2, "mlp_down": 1}


@dataclass(frozen=True)
class CpuInfo:
    """The CPU as the tables name it: model name, the bfloat16-relevant flags, torch's thread count."""

    model: str
    flags: dict  # CPU_FLAGS label -> present
    threads: int

    def describe(self) -> str:
        """One line for a title: the model, the flags it has and lacks, the thread count."""
        have = [name for name, on in self.flags.items() if on]
        lack = [name for name, on in self.flags.items() if not on]
        parts = " ".join(have) + (", " if have and lack else "") + ("no " + ", no ".join(lack) if lack else "")
        return f"{self.model} ({parts}; {self.threads} torch threads)"

    def flag_text(self) -> str:
        """``"AVX512-BF16 AVX512F -AMX-BF16"``: present flags, then absent ones with a minus (one CSV cell)."""
        return " ".join([k for k, v in self.flags.items() if v] + ["-" + k for k, v in self.flags.items() if not v])


def parse_cpuinfo(text: str, threads: int | None = None) -> CpuInfo:
    """The :class:`CpuInfo` of a ``/proc/cpuinfo`` text (first processor; x86 ``flags``, Arm ``Features``)."""
    flags = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features") and value.split():  # the first non-empty one
            flags = set(value.split())
            break
    model = cpu_model_name(text)
    threads = torch.get_num_threads() if threads is None else threads
    return CpuInfo(model, {label: flag in flags for flag, label in CPU_FLAGS.items()}, threads)


def cpu_info(path: str = "/proc/cpuinfo") -> CpuInfo:
    """This machine's :class:`CpuInfo` (no flags where ``path`` cannot be read: not Linux)."""
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError:
        text = ""
    return parse_cpuinfo(text)


def cores() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def call_times(fn: Callable[[], object], repeats: int, device="cpu", warmup: int = 1, number: int = 1) -> list[float]:
    """Wall seconds per call of ``fn``: ``repeats`` timings of ``number`` calls each, after ``warmup`` untimed calls
    (device synchronised around each timing)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(number):
            fn()
        synchronize(device)
        times.append((time.perf_counter() - start) / number)
    return times


def best_time(fn: Callable[[], object], repeats: int, device="cpu", budget_s: float = 0.02) -> float:
    """Best per-call seconds of ``repeats`` timings, each of enough calls to last about ``budget_s`` (at most 1,000):
    a limit is what the machine can do, and one scheduler hiccup on a shared machine must not set a microsecond one."""
    first = call_times(fn, 1, device)[0]  # after one warm-up call
    number = max(1, min(1000, int(budget_s / max(first, 1e-9))))
    if number == 1:  # a slow call (a large GEMM): the first timing counts as one of the repeats
        return min([first, *call_times(fn, repeats - 1, device, warmup=0)])
    return min(call_times(fn, repeats, device, warmup=0, number=number))


def linear_shapes(config) -> dict[str, tuple[int, int]]:
    """``name -> (in_features, out_features)`` of a decoder's linear products (q, k, v fused as ``qkv``)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return {"qkv": (hidden, (heads + 2 * kv) * head_dim), "o": (heads * head_dim, hidden),
            "mlp_up": (hidden, config.intermediate_size), "mlp_down": (config.intermediate_size, hidden),
            "lm_head": (hidden, config.vocab_size)}


def gemm(rows: int, k: int, n: int, dtype: torch.dtype, repeats: int = 3, device="cpu") -> dict:
    """``F.linear`` of ``[rows, k]`` by a ``[n, k]`` weight (:func:`best_time`): ``time_s``, ``flops``, ``gflop_s``
    and ``weight_gb_s`` (the weight's bytes / time)."""
    generator = torch.Generator(device=device).manual_seed(rows * 7 + n)
    x = torch.randn(rows, k, generator=generator, device=device).to(dtype)  # [rows, k]
    w = torch.randn(n, k, generator=generator, device=device).to(dtype)  # [n, k]
    with torch.inference_mode():
        best = best_time(lambda: torch.nn.functional.linear(x, w), repeats, device)
    flops = 2 * rows * k * n
    return {"time_s": best, "flops": flops, "gflop_s": flops / best / 1e9,
            "weight_gb_s": w.numel() * w.element_size() / best / 1e9}


def copy_bandwidth(mib: int = 256, repeats: int = 3, device="cpu") -> dict:
    """A copy of ``mib`` MiB into a preallocated tensor: ``gb_s`` = bytes read + written / :func:`best_time`."""
    source = torch.ones(mib * 2**20 // 4, device=device)  # float32, touched
    target = torch.empty_like(source)
    best = best_time(lambda: target.copy_(source), repeats, device)
    moved = 2 * source.numel() * source.element_size()
    return {"time_s": best, "bytes": moved, "gb_s": moved / best / 1e9}


def flop_weighted(rates: dict[str, dict]) -> float:
    """GFLOP/s of one decoder layer's linear mix (:data:`LAYER_MIX`): total FLOPs / total time of :func:`gemm` rows."""
    flops = sum(LAYER_MIX[name] * rates[name]["flops"] for name in LAYER_MIX)
    seconds = sum(LAYER_MIX[name] * rates[name]["time_s"] for name in LAYER_MIX)
    return flops / seconds / 1e9


@dataclass(frozen=True)
class ModelCost:
    """A loaded model's work per token, counted from its modules (not from a formula of the config).

    ``layer_params``: weights of every ``nn.Linear`` in the decoder layers (2 FLOPs each per token);
    ``head_params``: the output layer's; ``weight_bytes``: bytes one forward reads (every parameter once, tied
    weights once, the input embedding left out unless it is the output layer: a lookup reads only its rows).
    """

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    layer_params: int
    head_params: int
    weight_bytes: int
    element_size: int

    @classmethod
    def of(cls, model) -> ModelCost:
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        heads = config.num_attention_heads
        layer_params = sum(m.weight.numel() for layer in decoder_layers(model) for m in layer.modules()
                           if isinstance(m, torch.nn.Linear))
        head, embed = model.get_output_embeddings().weight, model.get_input_embeddings().weight
        unique = {p.data_ptr(): p for p in model.parameters()}
        weight_bytes = sum(p.numel() * p.element_size() for p in unique.values())
        if embed.data_ptr() != head.data_ptr():
            weight_bytes -= embed.numel() * embed.element_size()
        return cls(config.num_hidden_layers, heads, getattr(config, "num_key_value_heads", None) or heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads, layer_params, head.numel(),
                   weight_bytes, head.element_size())

    def attention_flops(self, queries: int, context: int, batch: int = 1) -> int:
        """QK and AV FLOPs of ``queries`` causal tokens after ``context`` cached ones, over every layer."""
        pairs = queries * context + queries * (queries + 1) // 2  # (query, key) pairs attended
        return 4 * batch * self.layers * self.heads * self.head_dim * pairs

    def forward_flops(self, tokens: int, context: int = 0, batch: int = 1, logits: int = 1) -> int:
        """FLOPs of one forward of ``tokens`` per row after ``context`` cached ones, ``logits`` output rows per row."""
        linear = 2 * batch * (tokens * self.layer_params + logits * self.head_params)
        return linear + self.attention_flops(tokens, context, batch)

    def kv_bytes(self, tokens: int, batch: int = 1) -> int:
        """Bytes of the keys and values of ``tokens`` cached positions (every layer, ``batch`` rows)."""
        return 2 * batch * self.layers * self.kv_heads * tokens * self.head_dim * self.element_size
