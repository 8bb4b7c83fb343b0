"""Full-KV accuracy per prompt mode: the baseline that tells whether a model answers the sample at all."""

from relaylens.experiments import ExperimentSpec

SPEC = ExperimentSpec(
    "full_kv",
    selectors=("full",),
    budgets=(1.0,),
    conditions=("original",),
    max_new_tokens=32,
    limit=None,
    figures=("table6",),
    description="No selection: keep every state. Run once per --prompt-mode to choose the embedded default's mode.",
)
