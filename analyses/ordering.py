"""Figure 5: does the order of the compact slots matter? Score / reverse / random orders vs source order."""

from relaylens.experiments import ExperimentSpec

SPEC = ExperimentSpec(
    "ordering",
    selectors=("snapkv",),
    budgets=(0.10,),
    conditions=("original", "relay", "score_order", "reverse_order")
    + tuple(f"random_order({seed})" for seed in range(5)),
    probes=True,
    limit=8,
    figures=("figure5",),
    description="Relay slots filled in source, score, reversed and five seeded random orders (RandomMean).",
)
