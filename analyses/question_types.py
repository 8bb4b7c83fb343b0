"""Table 6: accuracy per LongMemEval question type, original vs relay."""

from relaylens.experiments import ExperimentSpec

SPEC = ExperimentSpec(
    "question_types",
    selectors=("snapkv", "bm25"),
    budgets=(0.10,),
    conditions=("original", "relay"),
    limit=None,
    figures=("table6",),
    description="Per-type accuracy over the whole sample (all seven kinds incl. abstention).",
)
