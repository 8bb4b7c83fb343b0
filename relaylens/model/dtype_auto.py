"""``--dtype auto`` on a CPU: which dtype decodes faster on *this* machine, measured once and cached.

Why: CPU flags do not decide it. Issue 40 measured, on an AMD EPYC with AVX512-BF16 and no AMX, a bfloat16
matrix-vector product 12x slower than float32 with one torch build, and this project later measured bfloat16 faster
than float32 there once the decoding weights were prepacked (``docs/performance.md``). So on a CPU whose flags report
native bfloat16, :func:`measure` times the two products a record spends its time in, in both dtypes:

* the **decoding product**: ``rows`` x ``in_features`` by ``in_features`` x ``out_features`` (a Qwen2.5-0.5B MLP
  shape, 5 rows: one record's conditions decoded together; weights streamed from memory, not from cache), bfloat16
  through the same prepacked path decoding uses (:mod:`relaylens.model.packed`) where it is available, float32
  through ``F.linear``;
* the **prefill product**: the same weights against ``prefill_rows`` rows (a 2,048-token chunk), in GFLOP/s.

:func:`choose` picks per phase: the prefill's dtype is the one whose prefill product ran faster (the model loads in
it: weights, cache and attention), the decoding dtype the one whose decoding product ran faster. Where they differ,
the decoding steps' linear layers compute with a copy of their weights in the decoding dtype
(:func:`relaylens.model.packed.set_decoding_dtype`: one more copy of the linear weights, float32 copies of a bfloat16
model take twice its linear bytes), everything else stays in the model's dtype. The measurement is cached in
``$RELAYLENS_CACHE/dtype_auto.json`` per machine key (CPU model, flags, torch version, threads), so a run measures at
most once per machine; ``RELAYLENS_DTYPE_AUTO=flags`` skips it and decides by the flags alone (one dtype).

Example:
    >>> m = Measurement(key="k", decode_ms={"float32": 0.6, "bfloat16": 0.3},
    ...                 prefill_gflops={"float32": 95.0, "bfloat16": 370.0}, packed=True)
    >>> choose(m)  # (prefill, decoding)
    ('bfloat16', 'bfloat16')
    >>> choose(Measurement(key="k", decode_ms={"float32": 0.3, "bfloat16": 3.4},
    ...                    prefill_gflops={"float32": 95.0, "bfloat16": 370.0}, packed=False))
    ('bfloat16', 'float32')
    >>> m.describe()  # doctest: +NORMALIZE_WHITESPACE
    'decoding product 5x896x4864 bfloat16 (prepacked) 0.300 ms vs float32 0.600 ms;
     prefill 2048 rows bfloat16 370 vs float32 95 GFLOP/s'
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from relaylens.fileio import write_atomic
from relaylens.model.catalogue import cache_dir
from relaylens.model.packed import pack_linears, packed_linears

__all__ = ["Measurement", "measure", "measured", "choose", "machine_key", "cache_path"]

SHAPE = (896, 4864)  # in_features, out_features: Qwen2.5-0.5B's MLP up-projection
ROWS = 5  # rows of the decoding product: one record's conditions decoded together
PREFILL_ROWS = 2048  # rows of the prefill product: one prefill chunk


@dataclass(frozen=True)
class Measurement:
    """Both dtypes' decoding-product time (ms) and prefill-product throughput (GFLOP/s) on one machine."""

    key: str
    decode_ms: dict[str, float]
    prefill_gflops: dict[str, float]
    packed: bool
    shape: tuple[int, int] = SHAPE
    rows: int = ROWS
    prefill_rows: int = PREFILL_ROWS
    measured_at: str = field(default="", compare=False)

    def describe(self) -> str:
        """One line for the manifest's ``dtype_reason``."""
        (i, o), d, p = self.shape, self.decode_ms, self.prefill_gflops
        how = " (prepacked)" if self.packed else ""
        return (f"decoding product {self.rows}x{i}x{o} bfloat16{how} {d['bfloat16']:.3f} ms vs float32 "
                f"{d['float32']:.3f} ms; prefill {self.prefill_rows} rows bfloat16 {p['bfloat16']:.0f} vs float32 "
                f"{p['float32']:.0f} GFLOP/s")


def choose(measurement: Measurement) -> tuple[str, str]:
    """``(prefill dtype, decoding dtype)``: the dtype whose prefill product ran faster and the one whose decoding
    product ran faster (``bfloat16`` on a tie: half the bytes)."""
    d, p = measurement.decode_ms, measurement.prefill_gflops
    return ("bfloat16" if p["bfloat16"] >= p["float32"] else "float32",
            "bfloat16" if d["bfloat16"] <= d["float32"] else "float32")


def machine_key(flags: frozenset[str]) -> str:
    """What the measurement depends on: CPU model, bfloat16 flags, torch version, torch threads."""
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.partition(":")[2].strip() for line in handle if line.startswith("model name")), model)
    except OSError:
        pass
    bf16 = ",".join(sorted(f for f in flags if "bf16" in f or f == "avx512f"))
    return f"{model} | {bf16 or 'no bf16 flags'} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def cache_path() -> Path:
    """``$RELAYLENS_CACHE/dtype_auto.json`` (default ``~/.cache/relaylens``): measurements by machine key."""
    return cache_dir() / "dtype_auto.json"


def _median_ms(step, repeats: int) -> float:
    step()  # warm-up: kernels, allocator, oneDNN primitive cache
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        step()
        times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1e3


def measure(key: str, shape: tuple[int, int] = SHAPE, rows: int = ROWS, prefill_rows: int = PREFILL_ROWS,
            repeats: int = 10, layers: int = 8) -> Measurement:
    """Time both products in both dtypes on random weights: the decoding product as the mean over ``layers`` up and
    down projections streamed in turn (median of ``repeats`` passes), the prefill product on the first (about
    two seconds on a 2-core CPU, once per machine)."""
    with torch.random.fork_rng(devices=[]):  # random weights without moving the caller's random state
        torch.manual_seed(0)
        decode, prefill, packed = _time_products(shape, rows, prefill_rows, repeats, layers)
    return Measurement(key, decode, prefill, packed, tuple(shape), rows, prefill_rows,
                       time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def _time_products(shape, rows, prefill_rows, repeats, layers) -> tuple[dict, dict, bool]:
    decode, prefill, packed = {}, {}, False
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        # up and down projections in turn, more bytes than a CPU's last-level cache: each pass streams from memory,
        # as a decoding step does (one product measured alone would be served from cache)
        stack = torch.nn.Sequential(*(torch.nn.Linear(*(shape if i % 2 == 0 else shape[::-1]), bias=False)
                                      for i in range(2 * layers))).to(dtype).requires_grad_(False)
        x = torch.randn(rows, shape[0]).to(dtype)  # [rows, in_features]
        big = torch.randn(prefill_rows, shape[0]).to(dtype)  # [prefill_rows, in_features]
        packs = pack_linears(stack) if dtype == torch.bfloat16 else []
        packed = packed or bool(packs)
        with torch.no_grad(), packed_linears(packs):
            decode[name] = _median_ms(lambda stack=stack, x=x: stack(x), repeats) / len(stack)
        with torch.no_grad():
            ms = _median_ms(lambda first=stack[0], big=big: first(big), 2)
        prefill[name] = 2 * prefill_rows * shape[0] * shape[1] / (ms / 1e3) / 1e9
        del stack, packs
    return decode, prefill, packed


def measured(flags: frozenset[str]) -> tuple[Measurement, bool]:
    """``(measurement, from_cache)`` for this machine: read from :func:`cache_path`, else measured and stored."""
    key, path = machine_key(flags), cache_path()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    cached = cached if isinstance(cached, dict) else {}
    entry = _from_cache(cached.get(key), key)
    if entry is not None:
        return entry, True
    measurement = measure(key)  # none, or a damaged entry (another layout, text, NaN): measured again and replaced
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({**cached, key: asdict(measurement)}, indent=1, sort_keys=True))
    except OSError:
        pass  # a read-only cache: measured again next time, never an error
    return measurement, False


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _from_cache(entry, key: str) -> Measurement | None:
    """The cached measurement ``entry`` of machine ``key``, or None when it is anything but a whole one: both dtypes'
    decoding time and prefill throughput finite positive numbers, ``packed`` a bool, the shape and row counts
    positive integers (a hand-edited or damaged file is measured again, never chosen by, never a traceback).

    >>> good = {"key": "k", "decode_ms": {"float32": 0.6, "bfloat16": 0.3}, "packed": True,
    ...         "prefill_gflops": {"float32": 95.0, "bfloat16": 370.0}, "shape": [896, 4864]}
    >>> _from_cache(good, "k").decode_ms["bfloat16"], _from_cache({**good, "decode_ms": {"float32": 0.6}}, "k")
    (0.3, None)
    """
    if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("packed"), bool):
        return None
    for field_name in ("decode_ms", "prefill_gflops"):
        values = entry.get(field_name)
        if not isinstance(values, dict) or not all(_positive(values.get(d)) for d in ("float32", "bfloat16")):
            return None
    shape = entry.get("shape", SHAPE)
    counts = [*shape, entry.get("rows", ROWS), entry.get("prefill_rows", PREFILL_ROWS)] if isinstance(
        shape, (list, tuple)) and len(shape) == 2 else []
    if not counts or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in counts):
        return None
    known = {f.name for f in fields(Measurement)}
    try:
        return Measurement(**{**{k: v for k, v in entry.items() if k in known}, "shape": tuple(shape)})
    except TypeError:
        return None


def skip_measurement() -> bool:
    """``RELAYLENS_DTYPE_AUTO=flags``: decide by CPU flags alone."""
    return os.environ.get("RELAYLENS_DTYPE_AUTO", "").strip().lower() == "flags"
