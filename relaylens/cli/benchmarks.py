"""``relaylens bench NAME``: the benchmarks of :data:`relaylens.bench.registry.BENCHMARKS`, each told the options it
takes by its own entry there (no benchmark is named here)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import typer

from relaylens.cli.common import ATTN, DEVICE, DEVICE_MAP, DTYPE, MAX_POS, ROPE, console, fail, guard, load_kwargs
from relaylens.errors import RelaylensError
from relaylens.model.catalogue import DEFAULT_MODEL  # a name only: importing it loads no model code


def bench(
    which: str = typer.Argument("geometry", help="geometry, overhead, throughput, probes, prefill, selectors, scaling, "
                                "dtype (float32 vs bfloat16), regime (the paper's regime, decoding before vs "
                                "after), roofline (stages vs this machine's limits) or all"),
    out: Path = typer.Option(Path("runs/bench"), help="directory for the CSV and Markdown tables"),
    repeats: int = typer.Option(None, help="repetitions per timing, median reported (default: each benchmark's own; "
                                           "overhead: 3 per record, as the paper)"),
    small: bool = typer.Option(False, help="skip the Llama-3.1-8B-sized cache (1.6 GB of keys)"),
    records: int = typer.Option(None, help="records of the bundled sample (overhead, probes; default: the "
                                "benchmark's)"),
    new_tokens: int = typer.Option(None, "--new-tokens", help="greedy tokens per request (overhead, throughput)"),
    schedule: str = typer.Option(None, help="overhead: interleaved (default; the two conditions' requests alternate "
                                            "piece by piece) or back-to-back"),
    prefill_chunk: int = typer.Option(None, "--prefill-chunk", help="overhead: prefill chunk in tokens (default 256; "
                                      "0: the whole history in one pass)"),
    model: str = typer.Option(None, help="model of the model benchmarks (overhead, throughput, probes, prefill, "
                              f"scaling; default {DEFAULT_MODEL}); dtype and regime take a comma-separated list "
                              "(default qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct; regime: "
                              "qwen2.5-coder-0.5b-instruct)"),
    device: str = DEVICE, dtype: str = DTYPE, device_map: str = DEVICE_MAP, attn_implementation: str = ATTN,
    rope_scaling: str = ROPE, max_position: int = MAX_POS,
    quick: bool = typer.Option(False, help="roofline: tiny sizes (seconds; for tests)"),
    lengths: str = typer.Option(None, help="roofline: prefill lengths in tokens, comma-separated (default "
                                           "2048,8192,16384)"),
    data: str = typer.Option(None, help="regime and overhead: the records' data file (default: the bundled sample), "
                             "e.g. data/lme_qwen_2048.json.gz; overhead picks --records of them spread over history "
                             "length"),
    budgets: str = typer.Option(None, help="overhead: budgets, kept states per head (2048,8192: the paper's) or "
                                "ratios of the history (0.1); default 256,1024"),
    selectors: str = typer.Option(None, help="overhead: selectors, comma-separated (default bm25,snapkv,pyramidkv)"),
    steps: int = typer.Option(None, help="overhead, throughput: decoding steps per request (the paper: 128; an alias "
                              "of --new-tokens)"),
) -> None:
    """Benchmarks: ratios are measured in the same run; results go to a CSV and a Markdown table."""
    from relaylens.bench.geometry import write_results  # noqa: PLC0415 - CLI startup: the benchmarks import torch
    from relaylens.bench.registry import BENCHMARKS  # noqa: PLC0415 - CLI startup
    from relaylens.bench.requests import SCHEDULES  # noqa: PLC0415 - CLI startup

    if repeats is not None and repeats < 1:
        fail(f"--repeats must be at least 1 (a median needs one timing); got {repeats}")
    if schedule is not None and schedule not in SCHEDULES:
        fail(f"--schedule must be {' or '.join(SCHEDULES)}; got {schedule!r}")
    if prefill_chunk is not None and prefill_chunk < 0:
        fail(f"--prefill-chunk must be a number of tokens >= 0 (0: no chunks); got {prefill_chunk}")
    if steps is not None and new_tokens is not None and steps != new_tokens:
        fail(f"--steps {steps} and --new-tokens {new_tokens} disagree; they are one option. Fix: pass one of them")
    new_tokens = steps if steps is not None else new_tokens
    check_bench_options(records=records, new_tokens=new_tokens, lengths=lengths, budgets=budgets,
                        selectors=selectors, data=data)  # every option bounded before anything loads
    placement = load_kwargs(device, dtype, device_map, attn_implementation, rope_scaling, max_position)
    # placement always holds a resolved dtype; dtype is passed only when --dtype was given (regime defaults to bfloat16)
    values = dict(model_spec=model, records=records, new_tokens=new_tokens, repeats=repeats, include_large=not small,
                  schedule=schedule, prefill_chunk=prefill_chunk, quick=quick, lengths=lengths, load_kwargs=placement,
                  data=data, budgets=budgets, selectors=selectors,
                  dtype=None if dtype is None else str(placement["dtype"]).removeprefix("torch."))

    names = list(BENCHMARKS) if which == "all" else [which]
    for name in names:
        if name not in BENCHMARKS:
            fail(f"unknown benchmark {name!r}; choose one of {sorted(BENCHMARKS)} or all")
    for name in names:
        benchmark = BENCHMARKS[name]
        # a benchmark that draws its own progress bar gets no spinner beside it (they would fight for the terminal)
        with contextlib.nullcontext() if benchmark.own_progress else console.status(f"running benchmark {name} ..."):
            rows = guard(benchmark.run, **benchmark.arguments(values))
        csv_path, md_path = write_results(rows, out, name)
        if benchmark.write is not None:  # its own outputs (roofline: Markdown and JSON, the CPU named in each)
            md_path = ", ".join(str(p) for p in benchmark.write(rows, out))
        if benchmark.view is not None:
            console.print(benchmark.view(rows))
        else:
            print(md_path.read_text())
        console.print(f"[green]wrote[/] {csv_path} and {md_path}")


_MAX_RECORDS = 100_000
_MAX_NEW_TOKENS = 1_000_000


def check_bench_options(records=None, new_tokens=None, lengths=None, budgets=None, selectors=None, data=None) -> None:
    """Refuse an out-of-range ``relaylens bench`` option in one line, before any model loads or any work starts
    (issue 52 item 17): ``--records`` in 1..100,000, ``--new-tokens`` / ``--steps`` in 0..1,000,000, ``--lengths``
    positive and below 2**24, ``--budgets`` and ``--selectors`` parsed, ``--data`` an existing file or a known name."""
    from relaylens.bench.requests import parse_budgets, parse_selectors  # noqa: PLC0415 - CLI startup: imports torch
    from relaylens.bench.roofline import parse_lengths  # noqa: PLC0415 - CLI startup

    if records is not None and not 1 <= records <= _MAX_RECORDS:
        fail(f"--records must be between 1 and {_MAX_RECORDS:,} (records to time); got {records}")
    if new_tokens is not None and not 0 <= new_tokens <= _MAX_NEW_TOKENS:
        fail(f"--new-tokens / --steps must be between 0 and {_MAX_NEW_TOKENS:,} decoding steps; got {new_tokens}")
    for parse, value in ((parse_lengths, lengths), (parse_budgets, budgets), (parse_selectors, selectors)):
        if value is not None:
            try:
                parse(value)
            except RelaylensError as err:
                fail(str(err))
    if data is not None:
        from relaylens.datasets import resolve_data  # noqa: PLC0415 - CLI startup

        try:
            resolve_data(data)
        except Exception as err:  # noqa: BLE001 - any failure to find the file is the same one-line refusal
            fail(f"--data {data!r} cannot be read ({err}). Fix: pass an existing records file")
