"""Figure 5: does the order of the compact slots matter? Score / reverse / random orders vs source order."""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, PAPER_DECODING, Preset
from relaylens.experiments.specs import ExperimentSpec

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

PRESETS = {"paper": Preset(
    dict(selectors=("bm25",), budgets=(0.10,), conditions=("original", "relay", "score_order", "reverse_order")
         + tuple(f"random_order({seed})" for seed in range(5)), limit=0, **PAPER_DECODING),
    paper_model=LLAMA, paper_data="LongMemEval-S 200",
    notes="the number of random seeds is not stated in the paper (5 here); paper: RandomMean +7.5 over Original.")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
