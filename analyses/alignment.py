"""Right-aligned relay vs left-aligned rank_sync where retained counts differ (PyramidKV per layer, Ada-KV per head)."""

from relaylens.experiments import ExperimentSpec

SPEC = ExperimentSpec(
    "alignment",
    selectors=("pyramidkv", "adakv"),
    budgets=(0.10,),
    conditions=("original", "relay", "rank_sync"),
    probes=True,
    limit=8,
    figures=("alignment",),
    description="With heterogeneous counts, rank_sync leaves a gap between short heads and the question; relay closes it.",
)
