"""Request benchmarks: the Table 3 statistic, stage timing of one complete request, memory probes (CUDA mocked)."""

from __future__ import annotations

import json
import math
import mmap

import pytest
import torch

from relaylens.bench import model as bench_model
from relaylens.bench import requests as bench_requests
from relaylens.bench.model import proc_status_kb
from relaylens.bench.requests import (
    MemoryProbe,
    complete_request,
    kv_logical_bytes,
)
from relaylens.geometry.selection import Selection
from relaylens.reporting.overhead import geometric_mean_minus_one


def test_geometric_overhead_is_the_geometric_mean_of_ratios_minus_one():
    assert geometric_mean_minus_one([1.1, 1.1]) == pytest.approx(0.1)
    assert geometric_mean_minus_one([2.0, 0.5]) == pytest.approx(0.0)  # not the arithmetic mean (0.25)
    assert math.isnan(geometric_mean_minus_one([]))


def test_kv_logical_bytes_counts_valid_slots_only():
    sel = Selection.from_lists([[[0, 3, 7], [1]], [[2], [4, 5]]], history_length=8)
    assert kv_logical_bytes(sel, head_dim=16, dtype=torch.bfloat16) == 7 * 16 * 2 * 2


def test_cuda_memory_probe_reports_allocator_peaks_above_the_start(monkeypatch):
    state = {"allocated": 100 * 2**20, "reserved": 200 * 2**20, "peak_allocated": 0, "peak_reserved": 0, "synced": 0}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: state.update(peak_allocated=state["allocated"],
                                                         peak_reserved=state["reserved"]))
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
    size = 320 * 2**20  # more than anything resident before
    with MemoryProbe(torch.device("cpu")) as probe:
        # fresh anonymous pages, each written once: no allocator can hand back memory that was resident before
        # (a 320 MB tensor can reuse pages a freed one left behind in the same worker, and then nothing rises)
        region = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):
            region[offset] = 1
        held_kb = proc_status_kb("VmRSS")
        region.close()
    if probe.peaks["peak_rss_mb"] is None:
        pytest.skip("no /proc/self/clear_refs on this system")
    assert (held_kb - probe.before_kb) / 1024 >= 250, "the region's pages were resident while it was held"
    assert probe.peaks["peak_rss_mb"] >= 250


def test_memory_probe_reads_the_resident_set_where_the_mark_lags(monkeypatch):
    """The kernel folds the resident set into VmHWM lazily: a mark below VmRSS must not hide what is resident."""
    readings = {"VmRSS": 1000 * 1024}
    monkeypatch.setattr(bench_model, "proc_status_kb", lambda field: readings.get(field))
    monkeypatch.setattr(bench_requests, "proc_status_kb", lambda field: readings.get(field))
    monkeypatch.setattr(bench_requests, "reset_peak_rss", lambda: True)
    with MemoryProbe(torch.device("cpu")) as probe:
        readings.update(VmHWM=1000 * 1024, VmRSS=1300 * 1024)
    assert probe.peaks == {"peak_rss_mb": 300.0}


def _tiny_prompts(tmp_path, n: int = 1):
    from relaylens.datasets import load_records
    from relaylens.datasets.prompting import render_prompt
    from relaylens.datasets.synthetic import generate_records
    from relaylens.testing import tiny_model, tiny_tokenizer

    data = tmp_path / "records.json"
    data.write_text(json.dumps(generate_records(n=n, seed=3, history_tokens=800)))
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    return model, tokenizer, [render_prompt(r, tokenizer, mode="completion") for r in load_records(data)]


STAGES = ("prefill_s", "selection_s", "relocation_s", "question_s", "generation_s")


@pytest.mark.parametrize("prefill_chunk", [None, 128])
def test_complete_request_times_every_stage_and_decodes_exactly_n_tokens(tmp_path, prefill_chunk):
    from relaylens.geometry.rotary import RotaryFactors
    from relaylens.selectors import make_selector

    model, _, (prompt,) = _tiny_prompts(tmp_path)
    factors = RotaryFactors.from_model(model)
    out = {c: complete_request(model, prompt, make_selector("snapkv"), 64, c, factors, 5, prefill_chunk)
           for c in ("original", "relay")}
    for timing in out.values():
        assert all(timing[s] > 0 for s in STAGES) and timing["float32_copy_s"] > 0
        assert timing["request_s"] == pytest.approx(sum(timing[s] for s in STAGES))
        assert timing["tokens"] == 5
    assert out["original"]["kv_logical_mb"] == out["relay"]["kv_logical_mb"] > 0


def test_timed_pieces_runs_requests_round_robin_and_sums_each_ones_own_pieces(monkeypatch):
    clock, order = [0.0], []

    def request(name, stages, cost):
        for stage in stages:
            order.append(name)
            clock[0] += cost  # this piece's work: the fake clock advances only while it runs
            yield stage

    monkeypatch.setattr(bench_requests.time, "perf_counter", lambda: clock[0])
    a = request("a", ["prefill_s", "prefill_s", "selection_s", "generation_s"], 1.0)
    b = request("b", ["prefill_s", "generation_s"], 10.0)
    times = bench_requests.timed_pieces(torch.device("cpu"), [a, b])
    assert order == ["a", "b", "b", "a", "a", "a"]  # the order flips every round
    assert times[0]["prefill_s"] == 2.0 and times[0]["selection_s"] == 1.0 and times[0]["request_s"] == 4.0
    assert times[1]["prefill_s"] == 10.0 and times[1]["generation_s"] == 10.0 and times[1]["request_s"] == 20.0


def test_interleaved_pair_decodes_what_each_request_decodes_alone(tmp_path):
    """Two requests run piece by piece in turn (prefill chunks included) decode the same tokens as each one alone."""
    from relaylens.geometry.rotary import RotaryFactors
    from relaylens.selectors import make_selector

    model, _, (prompt,) = _tiny_prompts(tmp_path)
    factors, selector = RotaryFactors.from_model(model), make_selector("snapkv")
    alone, together = {}, [{}, {}]
    for condition in ("original", "relay"):
        out = {}
        bench_requests.timed_pieces(model.device, [bench_requests.request_pieces(
            model, prompt, selector, 64, condition, factors, 6, out, 128)])
        alone[condition] = out
    pieces = [bench_requests.request_pieces(model, prompt, selector, 64, c, factors, 6, o, 128)
              for c, o in zip(("original", "relay"), together)]
    times = bench_requests.timed_pieces(model.device, pieces)
    for condition, out, timing in zip(("original", "relay"), together, times):
        assert out["tokens"] == 6 and all(timing[s] > 0 for s in STAGES)
        assert out["token_ids"] == alone[condition]["token_ids"]
        for (k1, v1), (k2, v2) in zip(out["layers"].data, alone[condition]["layers"].data):
            assert torch.equal(k1, k2) and torch.equal(v1, v2)
    assert together[0]["token_ids"] != [] and together[0]["layers"].coordinates.condition != \
        together[1]["layers"].coordinates.condition


@pytest.mark.parametrize("schedule", ["interleaved", "back-to-back"])
def test_run_overhead_reports_paired_overhead_stage_times_and_memory(tmp_path, monkeypatch, schedule):
    model, tokenizer, prompts = _tiny_prompts(tmp_path, n=2)
    monkeypatch.setattr(bench_requests, "load_bench_model", lambda spec, kwargs=None: (model, tokenizer))
    monkeypatch.setattr(bench_requests, "sample_prompts", lambda tok, count: prompts[:count])
    applied = []
    monkeypatch.setattr(bench_requests, "steady_allocator", lambda: applied.append(True) or True)
    rows = bench_requests.run_overhead(repeats=2, records=2, new_tokens=3, selectors=("snapkv", "pyramidkv"),
                                       budgets=(64,),
                                       schedule=schedule, prefill_chunk=256)
    summary = [r for r in rows if r["case"] == "geometric mean"]
    per_record = [r for r in rows if r["case"] != "geometric mean"]
    assert ([(r["selector"], r["records"], r["schedule"]) for r in summary]
            == [("snapkv", 2, schedule), ("pyramidkv", 2, schedule)])
    assert len(per_record) == 2 * 2 * 2 and all(r["tokens"] == 3 for r in per_record)
    for row in summary:
        mine = [r for r in per_record if r["selector"] == row["selector"]]
        ratios = [r["ratio_vs_original"] for r in mine if r["condition"] == "relay"]
        assert row["overhead_pct"] == pytest.approx(100 * geometric_mean_minus_one(ratios))
        assert math.isfinite(row["overhead_cpu_pct"]) and row["relocation_ms_relay"] > 0 and row["float32_copy_ms"] > 0
    with_peaks = [r for r in per_record if "peak_rss_mb" in r]
    first = prompts[0].record_id
    expected = [r for r in per_record if r["case"].startswith(first)] if schedule == "interleaved" else per_record
    assert with_peaks == expected
    assert applied == [True]


def test_steady_allocator_applies_on_glibc(tmp_path):
    import platform
    import subprocess
    import sys

    code = "from relaylens.bench.requests import steady_allocator; print(steady_allocator())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(platform.libc_ver()[0] == "glibc")


def test_table3_statistic_from_run_tables_matches_a_hand_computation():
    """Two records, three repetitions each: medians, paired ratios, geometric mean minus one; batched rows excluded."""
    import pandas as pd

    from relaylens.reporting.figures.overhead import table3

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


def test_run_throughput_compares_rows_one_by_one_with_one_batch(tmp_path, monkeypatch):
    model, tokenizer, prompts = _tiny_prompts(tmp_path)
    monkeypatch.setattr(bench_requests, "load_bench_model", lambda spec, kwargs=None: (model, tokenizer))
    monkeypatch.setattr(bench_requests, "sample_prompts", lambda tok, count: prompts[:count])
    rows = bench_requests.run_throughput(new_tokens=3, compare=(2, 3), counts=(1, 16),  # 16 > the 10-row pool
                                         selectors=("snapkv", "pyramidkv"))
    compared = [r for r in rows if "sequential_s" in r]
    assert [r["rows"] for r in compared] == [2, 3]
    for row in compared:
        assert row["same_tokens"], f"{row['rows']} rows: batched decoding changed the tokens"
        assert row["speedup"] == pytest.approx(row["sequential_s"] / row["batched_s"])
        assert row["batched_tok_s"] == pytest.approx(row["rows"] * 3 / row["batched_s"])
    scaling = [r for r in rows if r["case"].endswith("rows batched")]
    assert [r["rows"] for r in scaling] == [1, 16] and all(r["batched_s"] > 0 for r in scaling)
