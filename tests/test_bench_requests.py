"""Request benchmarks: the Table 3 statistic, stage timing of one complete request, memory probes (CUDA mocked)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from relaylens import bench_requests
from relaylens.bench_requests import MemoryProbe, complete_request, geometric_overhead, kv_logical_bytes
from relaylens.selection import Selection


def test_geometric_overhead_is_the_geometric_mean_of_ratios_minus_one():
    assert geometric_overhead([1.1, 1.1]) == pytest.approx(0.1)
    assert geometric_overhead([2.0, 0.5]) == pytest.approx(0.0)  # not the arithmetic mean (0.25)
    assert math.isnan(geometric_overhead([]))


def test_kv_logical_bytes_counts_valid_slots_only():
    sel = Selection.from_lists([[[0, 3, 7], [1]], [[2], [4, 5]]], history_length=8)
    assert kv_logical_bytes(sel, head_dim=16, dtype=torch.bfloat16) == 7 * 16 * 2 * 2


def test_cuda_memory_probe_reports_allocator_peaks_above_the_start(monkeypatch):
    state = {"allocated": 100 * 2**20, "reserved": 200 * 2**20, "peak_allocated": 0, "peak_reserved": 0, "synced": 0}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: state.update(peak_allocated=state["allocated"], peak_reserved=state["reserved"]))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: state["reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: state["peak_allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: state["peak_reserved"])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: state.update(synced=state["synced"] + 1))
    with MemoryProbe(torch.device("cuda", 0)) as probe:
        state.update(peak_allocated=state["allocated"] + 48 * 2**20, peak_reserved=state["reserved"] + 64 * 2**20)
    assert probe.peaks == {"peak_allocated_mb": 48.0, "peak_reserved_mb": 64.0}
    assert state["synced"] == 1, "the peaks are read after the device finished"
    bench_requests.synchronize(torch.device("cuda", 0))
    assert state["synced"] == 2


def test_cpu_memory_probe_sees_a_large_allocation():
    with MemoryProbe(torch.device("cpu")) as probe:
        block = torch.ones(320 * 2**20 // 4)  # 320 MB, touched: more than anything resident before
        del block
    if probe.peaks["peak_rss_mb"] is None:
        pytest.skip("no /proc/self/clear_refs on this system")
    assert probe.peaks["peak_rss_mb"] >= 250


def test_complete_request_times_every_stage_and_decodes_exactly_n_tokens(tmp_path):
    from relaylens.datasets.synthetic import generate_records
    from relaylens.geometry import RotaryFactors
    from relaylens.prompting import render_prompt
    from relaylens.datasets import load_records
    from relaylens.selectors import make_selector
    from relaylens.testing import tiny_model, tiny_tokenizer

    data = tmp_path / "records.json"
    data.write_text(json.dumps(generate_records(n=1, seed=3, history_tokens=800)))
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    prompt = render_prompt(load_records(data)[0], tokenizer, mode="completion")
    factors = RotaryFactors.from_model(model)
    out = {c: complete_request(model, prompt, make_selector("snapkv"), 64, c, factors, 5) for c in ("original", "relay")}
    for timing in out.values():
        stages = ("prefill_s", "selection_s", "relocation_s", "question_s", "generation_s")
        assert all(timing[s] > 0 for s in stages) and timing["float32_copy_s"] > 0
        assert timing["request_s"] == pytest.approx(sum(timing[s] for s in stages))
        assert timing["tokens"] == 5
    assert out["original"]["kv_logical_mb"] == out["relay"]["kv_logical_mb"] > 0


def test_table3_statistic_from_run_tables_matches_a_hand_computation():
    """Two records, three repetitions each: medians, paired ratios, geometric mean minus one; batched rows excluded."""
    import pandas as pd

    from relaylens.figures.overhead import table3

    rows = []
    times = {("a", "original"): [2.0, 2.2, 9.0], ("a", "relay"): [2.1, 2.2, 2.3],  # medians 2.2 / 2.2
             ("b", "original"): [4.0, 4.0, 4.0], ("b", "relay"): [4.4, 4.4, 4.4]}  # ratio 1.1
    for (record, condition), values in times.items():
        for value in values:
            rows.append(dict(record_id=record, selector="snapkv", budget=256.0, condition=condition, prefill_s=1.0,
                             selection_s=0.0, elapsed_s=value - 1.0, new_tokens=10, batch_rows=1))
    rows.append(dict(record_id="c", selector="bm25", budget=256.0, condition="relay", prefill_s=1.0, selection_s=0.1,
                     elapsed_s=1.0, new_tokens=10, batch_rows=5))
    rows.append(dict(rows[-1], condition="original"))
    table = table3({"answers": pd.DataFrame(rows)})
    relay = table[(table.selector == "snapkv") & (table.condition == "relay")].iloc[0]
    assert relay["overhead_pct"] == pytest.approx(100 * (math.sqrt(1.0 * 1.1) - 1))
    batched = table[table.selector == "bm25"]
    assert batched["overhead_pct"].isna().all() and set(batched["timing"]) == {"batched"}
