"""Table 1: six selectors x {original, relay} at 10% retention."""

from relaylens.experiments import ExperimentSpec

SPEC = ExperimentSpec(
    "main_table",
    selectors=("bm25", "snapkv", "h2o", "pyramidkv", "chunkkv", "cam"),
    budgets=(0.10,),
    conditions=("original", "relay"),
    limit=8,
    figures=("table1",),
    description="Answer quality of six selectors at 10% retention, original vs RoPERelay coordinates.",
)
