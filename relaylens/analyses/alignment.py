"""Right-aligned relay vs left-aligned rank_sync where retained counts differ (PyramidKV per layer, Ada-KV per head)."""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, PAPER_DECODING, QWEN, Preset
from relaylens.experiments.specs import ExperimentSpec

SPEC = ExperimentSpec(
    "alignment",
    selectors=("pyramidkv", "adakv"),
    budgets=(0.10,),
    conditions=("original", "relay", "rank_sync"),
    probes=True,
    limit=8,
    figures=("alignment",),
    description="With heterogeneous counts, rank_sync leaves a gap between short heads and the question; relay closes "
                "it.",
)

PRESETS = {"paper": Preset(
    dict(selectors=("bm25", "pyramidkv"), budgets=(0.10,), conditions=("original", "rank_sync", "relay"), limit=0,
         **PAPER_DECODING),
    paper_model=f"{LLAMA}; {QWEN}", paper_data="LongMemEval-S 200", metric="judge, token F1")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
