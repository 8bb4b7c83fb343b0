"""Time one greedy decoding step, dynamic vs static (issue 51 item 2), against the weights-read floor.

A random-weight model of a named architecture (``--model random:qwen2.5-0.5b``, no weights needed), a history of
``--kept`` random tokens prefilled once and kept whole (``original``), and ``--batches`` rows decoded together for
``--steps`` steps with EOS off, along each decoding path: ``dynamic`` (today's: the cache grows, the host reads every
step), ``static`` (preallocated slots, device-side stops, a host read every 8 steps, the step run eagerly) and
``static+BACKEND`` for each ``--compile`` backend (the step compiled with ``fullgraph=True``; the first call compiles,
so each arm runs once untimed first). Per step: the median over ``--repeats`` of ``(run with S + 1 tokens - run with 1
token) / S`` (each path's setup, such as the static buffers, amortised into its steps), the ratio to the weights-read
floor (the model's weight bytes at the measured copy bandwidth), and whether every path gave the dynamic path's
tokens. Prints one JSON line per (batch, path) and writes ``decoding_step_timing.json`` to ``--out``.

Run: ``python scripts/decoding_step_timing.py --device cpu --dtype bfloat16`` (on a GPU: ``--device cuda
--compile inductor,cudagraphs --model random:llama-3.1-8b``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from relaylens.bench.machine import copy_bandwidth
from relaylens.generation.rows import Row, run_rows
from relaylens.generation.settings import DecodeSettings
from relaylens.geometry.selection import Selection
from relaylens.model.loading import load_model
from relaylens.model.prefill import prefill_history


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="random:qwen2.5-0.5b")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--kept", type=int, default=2048)
    parser.add_argument("--batches", default="1,5,12")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", default="", help="comma-separated torch.compile backends for the static step")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model, _ = load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    history = torch.randint(3, vocab, (args.kept,), generator=generator)
    question = torch.randint(3, vocab, (8,), generator=generator)
    prefill = prefill_history(model, history, capture_window_queries=False)
    keep = torch.arange(args.kept).expand(prefill.num_layers, prefill.num_kv_heads, -1)  # [layer, kv_head, slot]
    selection = Selection(keep, torch.ones_like(keep, dtype=torch.bool), args.kept)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = copy_bandwidth(256, 3, args.device)["gb_s"]
    floor_ms = 1e3 * weight_bytes / (bandwidth * 1e9)
    paths = {"dynamic": {}, "static": {"decoding": "static"}}
    paths.update({f"static+{b}": {"decoding": "static", "compile_backend": b} for b in args.compile.split(",") if b})
    results = []
    for batch in (int(b) for b in args.batches.split(",")):
        rows = [Row(selection, "original")] * batch
        reference = None
        for name, extra in paths.items():
            def run(tokens, extra=extra):
                sync()
                start = time.perf_counter()
                out = run_rows(model, prefill, rows, question, DecodeSettings(max_new_tokens=tokens, eos_token_ids=(),
                                                                              **extra))
                sync()
                return time.perf_counter() - start, [r.token_ids for r in out]

            run(args.steps + 1)  # warm-up (and the compile, for compiled arms)
            per_step, tokens = [], None
            for _ in range(args.repeats):
                short, _ = run(1)
                full, tokens = run(args.steps + 1)
                per_step.append((full - short) / args.steps)
            reference = reference if reference is not None else tokens
            row = {"batch": batch, "path": name, "step_ms": round(1e3 * statistics.median(per_step), 2),
                   "floor_ms": round(floor_ms, 2), "same_tokens_as_dynamic": tokens == reference,
                   "model": args.model, "dtype": args.dtype, "kept": args.kept, "steps": args.steps,
                   "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor()
                   or platform.machine(), "torch": torch.__version__}
            row["x_floor"] = round(row["step_ms"] / floor_ms, 2)
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "decoding_step_timing.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
