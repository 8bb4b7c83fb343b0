"""Table 3: the cost of RoPERelay in a complete request (prefill, selection, relocation, question, generation)."""

from relaylens.experiments import ExperimentSpec

SPEC = ExperimentSpec(
    "overhead",
    selectors=("snapkv",),
    budgets=(0.10,),
    conditions=("original", "relay"),
    max_new_tokens=32,
    limit=4,
    figures=("table3",),
    description="Timing columns of original vs relay requests on the same cache; see also `relaylens bench overhead`.",
)
