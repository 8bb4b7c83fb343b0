"""Figure 4: which part of RoPERelay matters - keys, query, or both - with a BM25 budget."""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import PAPER_DECODING, QWEN, Preset
from relaylens.experiments.specs import ExperimentSpec

SPEC = ExperimentSpec(
    "coordinate_ablation",
    selectors=("bm25",),
    budgets=(0.10,),
    conditions=("original", "key_only", "relay", "query_only(2048)", "common_shift(2048)"),
    probes=True,
    limit=8,
    figures=("figure4",),
    description="Original, key-only compaction, full RoPERelay, query-only shift and a common shift (RoPE invariance "
                "control).",
)

PRESETS = {"paper": Preset(
    dict(selectors=("bm25",), budgets=(8192,), conditions=("original", "key_only", "relay", "query_only(2048)",
                                                           "common_shift(2048)"), limit=0, **PAPER_DECODING),
    paper_model=QWEN, paper_data="LongMemEval-S 500",
    notes="paper: Original 26.4, Key-only 8.4, Sync 36.2, Query-only 27.2, CommonShift 27.2 (judge).")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
