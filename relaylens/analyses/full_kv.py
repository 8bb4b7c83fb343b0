"""Full-KV accuracy per prompt mode: the baseline that tells whether a model answers the sample at all."""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, PAPER_DECODING, QWEN, Preset
from relaylens.experiments.specs import ExperimentSpec

SPEC = ExperimentSpec(
    "full_kv",
    selectors=("full",),
    budgets=(1.0,),
    conditions=("original",),
    max_new_tokens=32,
    limit=0,
    figures=("table6",),
    description="No selection: keep every state. Run once per --prompt-mode to choose the embedded default's mode.",
)

PRESETS = {"paper": Preset(
    dict(selectors=("full",), budgets=(1.0,), conditions=("original",), limit=0, **PAPER_DECODING),
    paper_model=f"{LLAMA}; {QWEN}", paper_data="the Table 1 datasets", metric="judge / choice accuracy",
    notes="the FullKV reference row of Table 1.")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
