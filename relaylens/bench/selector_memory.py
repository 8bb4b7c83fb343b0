"""Peak extra host memory of H2O's column-sum capture versus a plain sdpa history prefill (a measurement, not a test).

Each mode runs in a fresh subprocess: build a random-weight Llama of the given geometry (default: SmolLM2-135M's,
30 layers, 9 query heads, 3 kv heads, head_dim 64), warm up, reset the kernel's high-water mark
(``/proc/self/clear_refs``), run :func:`relaylens.model.prefill.prefill_history` on ``length`` random tokens with or
without :func:`capture_column_sums`, and report ``max(VmHWM, VmRSS) - VmRSS(before)``. Linux only.

Usage::

    python -m relaylens.bench.selector_memory --length 8000 --block-size 256
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time

import torch

from relaylens.bench.model import proc_status_kb, reset_peak_rss
from relaylens.errors import RelaylensError
from relaylens.model.prefill import prefill_history

SMOLLM2_GEOMETRY = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    vocab_size=49152,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)


def _proc_kb(field: str) -> int:
    value = proc_status_kb(field)
    if value is None:
        raise RelaylensError(f"/proc/self/status has no {field} (this measurement needs Linux). Fix: run the "
                             "selector memory measurement on Linux")
    return value


def _measure(mode: str, length: int, block_size: int, threads: int) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - import cost: transformers loads on first use


    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(**SMOLLM2_GEOMETRY, rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, cfg.vocab_size, (length,))
    prefill_history(model, ids[:64], window_size=32)  # warm-up: kernels, allocator, thread pools
    gc.collect()
    before = _proc_kb("VmRSS")
    if not reset_peak_rss():
        raise RelaylensError("cannot reset the high-water mark (/proc/self/clear_refs); this measurement needs Linux. "
                             "Fix: run the selector memory measurement on Linux")
    start = time.perf_counter()
    if mode == "plain":
        pre = prefill_history(model, ids, window_size=32)
    else:
        pre = prefill_history(model, ids, window_size=32, column_sums=True, column_block_size=block_size)
    seconds = time.perf_counter() - start
    peak = max(_proc_kb("VmHWM"), _proc_kb("VmRSS"))  # the mark can lag the resident set (resident_peak_kb)
    cache_mb = sum(k.numel() * k.element_size() * 2 for k in pre.keys) / 2**20
    return {
        "mode": mode,
        "length": length,
        "block_size": block_size,
        "peak_extra_mb": (peak - before) / 1024,
        "kv_cache_mb": cache_mb,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=8000)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mode", choices=("plain", "h2o"), default=None, help="internal: run one mode in-process")
    args = parser.parse_args(argv)
    if args.mode:
        print(json.dumps(_measure(args.mode, args.length, args.block_size, args.threads)))
        return
    results = []
    for mode in ("plain", "h2o"):
        cmd = [sys.executable, "-m", "relaylens.bench.selector_memory", "--mode", mode, "--length", str(args.length),
               "--block-size", str(args.block_size), "--threads", str(args.threads)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    g = SMOLLM2_GEOMETRY
    expected = 4 * g["num_attention_heads"] * args.block_size * args.length / 2**20
    report = {
        "plain": results[0],
        "h2o": results[1],
        "h2o_minus_plain_mb": results[1]["peak_extra_mb"] - results[0]["peak_extra_mb"],
        "block_buffer_mb (4*H*block*L)": expected,
        "dense_LxL_per_layer_mb (4*H*L*L)": 4 * g["num_attention_heads"] * args.length**2 / 2**20,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
