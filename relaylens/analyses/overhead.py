"""Table 3: the cost of RoPERelay in a complete request (prefill, selection, relocation, question, generation).

Runs one row at a time (``batch_rows=1`` in its record: the ``--batch-rows`` default) so every answer row carries
its own complete-request time ``prefill_s + selection_s + elapsed_s``; ``table3`` reports the geometric mean of the
paired per-record ratios (condition / original) minus one, as the paper does. ``relaylens bench overhead`` measures
the same statistic with repeated, interleaved requests and stage times.
"""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, Preset
from relaylens.experiments.specs import ExperimentSpec
from relaylens.reporting.overhead import overhead_table  # noqa: F401 - the Table 3 statistic of this analysis

SPEC = ExperimentSpec(
    "overhead",
    selectors=("bm25", "snapkv", "pyramidkv"),
    budgets=(256, 1024),
    conditions=("original", "relay"),
    max_new_tokens=128,
    stop="none",
    limit=4,
    figures=("table3",),
    description="Complete-request time of original vs relay on the same selection (run one row at a time); "
                "Table 3 statistic: geometric mean of paired ratios minus one. See also `relaylens bench overhead`.",
)

PRESETS = {"paper": Preset(
    dict(selectors=("bm25", "snapkv", "pyramidkv"), budgets=(2048, 8192), conditions=("original", "relay"),
         max_new_tokens=128, stop="none", prompt_mode="auto", granularity="session", limit=20),
    paper_model=f"{LLAMA}, BF16, SDPA, 4x RTX 3090", paper_data="LongMemEval-S 20, stratified by history length",
    metric="time, memory", notes="128 generation steps (no early stop); 3 repetitions: `relaylens bench overhead`.")}

#: one row decoded at a time (the ``--batch-rows`` default for this analysis): per-request timings
ANALYSIS = Analysis(SPEC, PRESETS, batch_rows=1, doc=__doc__)
