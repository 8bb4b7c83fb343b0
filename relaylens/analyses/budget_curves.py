"""Figure 3: retention 1%, 5%, 10%, 20%, original vs relay, one panel per selector."""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, PAPER_DECODING, SIX_SELECTORS, Preset
from relaylens.experiments.specs import ExperimentSpec

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

PRESETS = {"paper": Preset(
    dict(selectors=SIX_SELECTORS, budgets=(0.01, 0.05, 0.10, 0.20), conditions=("original", "relay"), limit=0,
         **PAPER_DECODING),
    paper_model=LLAMA, paper_data="LongMemEval-S 200")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
