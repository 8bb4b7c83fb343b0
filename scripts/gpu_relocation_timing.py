"""Time one ``relocate_selection`` at Llama-3.1-8B shape (issue 51 item 1; target <= 5 ms on an H200 at B8192).

32 layers x 8 kv heads x head_dim 128, bfloat16, a 32,768-token history of random keys (no forward pass), a SnapKV-like
selection of B states per head (random, sorted), the model's own llama3 rotary (``random:llama-3.1-8b`` with one
layer, for the factors only). Prints and writes (``--out``) per budget and condition: the median of the batched path,
the per-layer loop it replaced (the path before issue 51), the host synchronisations of each (torch.profiler), and
whether the two agree bit for bit. Run: ``python3 scripts/gpu_relocation_timing.py --device cuda --out DIR``."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from relaylens.generation import cache as cache_module
from relaylens.generation.cache import coordinates_of, relocate_selection
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.model.loading import load_model
from relaylens.model.prefill import PrefillResult

SYNCS = ("aten::item", "aten::is_nonzero", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaMemcpyAsync")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--history", type=int, default=32768)
    parser.add_argument("--budgets", default="2048,8192")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device, dtype = args.device, torch.bfloat16 if args.device != "cpu" else torch.float32
    model, _ = load_model("random:llama-3.1-8b?num_hidden_layers=1&vocab_size=512", dtype=dtype, device=device)
    factors = RotaryFactors.from_model(model)
    heads, dim, length = 8, 128, args.history
    generator = torch.Generator(device=device).manual_seed(0)
    keys = [torch.randn(heads, length, dim, device=device, dtype=dtype, generator=generator)
            for _ in range(args.layers)]
    values = [torch.randn(heads, length, dim, device=device, dtype=dtype, generator=generator)
              for _ in range(args.layers)]
    prefill = PrefillResult(torch.zeros(length, dtype=torch.long), keys, values, None, 32, dim ** -0.5, 4)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    results = []
    for budget in (int(b) for b in args.budgets.split(",")):
        scores = torch.rand(args.layers, heads, length, generator=torch.Generator().manual_seed(budget))
        positions = scores.topk(budget, dim=-1).indices.sort(-1).values  # [layer, kv_head, B]
        selection = Selection(positions, torch.ones_like(positions, dtype=torch.bool), length)
        for condition in ("original", "relay"):
            def batched():
                return relocate_selection(prefill, selection, condition, factors)

            def loop():
                coords = coordinates_of(condition, selection)
                return cache_module._relocate_each_layer(prefill, selection, coords, factors, "condition", False)

            row = {"budget": budget, "condition": condition, "history": length, "layers": args.layers,
                   "device": torch.cuda.get_device_name() if device.startswith("cuda") else device}
            for name, fn in (("batched", batched), ("loop", loop)):
                fn()
                sync()
                times = []
                for _ in range(args.repeats if name == "batched" else max(2, args.repeats // 4)):
                    start = time.perf_counter()
                    fn()
                    sync()
                    times.append(time.perf_counter() - start)
                row[f"{name}_ms"] = 1e3 * statistics.median(times)
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
                with profile(activities=activities) as prof:
                    fn()
                    sync()
                names = [e.name for e in prof.events()]
                row[f"{name}_syncs"] = {n: names.count(n) for n in SYNCS if names.count(n)}
            a, b = batched(), loop()
            row["bit_equal"] = all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a.data, b.data))
            row["target_ms"] = 5.0
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "relocation_timing.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
