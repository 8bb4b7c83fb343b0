"""Figure 4: which part of RoPERelay matters - keys, query, or both - with a BM25 budget."""

from relaylens.experiments import ExperimentSpec

SPEC = ExperimentSpec(
    "coordinate_ablation",
    selectors=("bm25",),
    budgets=(0.10,),
    conditions=("original", "key_only", "relay", "query_only(2048)", "common_shift(2048)"),
    probes=True,
    limit=8,
    figures=("figure4",),
    description="Original, key-only compaction, full RoPERelay, query-only shift and a common shift (RoPE invariance control).",
)
