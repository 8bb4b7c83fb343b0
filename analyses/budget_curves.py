"""Figure 3: retention 1%, 5%, 10%, 20%, original vs relay, one panel per selector."""

from relaylens.experiments import ExperimentSpec

SPEC = ExperimentSpec(
    "budget_curves",
    selectors=("bm25", "snapkv", "pyramidkv"),
    budgets=(0.05, 0.10, 0.20, 0.40),
    conditions=("original", "relay"),
    limit=8,
    figures=("figure3",),
    description="Accuracy as the retention budget grows (CPU default starts at 5%: 1% of a 2k history is ~20 states, "
    "below the 32-token window; pass --budget 0.01 on long histories).",
)
