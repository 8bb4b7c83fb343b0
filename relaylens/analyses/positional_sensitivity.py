"""Positional sensitivity: at each condition, the gradient of the first answer token's log-probability w.r.t. every
(layer, kv head)'s distance ``b`` to the question and gap scale ``s`` (:mod:`relaylens.probes.sensitivity`; one
backward pass per record and condition), drawn as layer x kv head heat maps. Which heads want their keys closer,
and which want wider gaps? Not an experiment of the paper.
"""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, PAPER_DECODING, QWEN, Preset
from relaylens.experiments.specs import ExperimentSpec

SPEC = ExperimentSpec(
    "positional_sensitivity",
    selectors=("bm25",),
    budgets=(0.10,),
    conditions=("original", "relay", "key_only"),
    probes=True,
    sensitivity=True,
    limit=8,
    figures=("positional_sensitivity",),
    description="d log p(first answer token) / d b and / d s per (layer, kv head) under original, relay and key_only.",
)

PRESETS = {"paper": Preset(
    dict(selectors=("bm25",), budgets=(0.10,), conditions=("original", "relay", "key_only"), limit=0, **PAPER_DECODING),
    paper_model=f"not in the paper; its models: {LLAMA}; {QWEN}", paper_data="LongMemEval-S (not in the paper)",
    metric="probes", notes="Not an experiment of the paper (issue 31): the positional sensitivity readout.")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
