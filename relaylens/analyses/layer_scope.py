"""Which layers carry the RoPERelay effect: relay in one band or one layer type only, everything else original.

Conditions (one BM25 10% selection per record, shared): ``original``; ``relay`` everywhere; relay in the early,
middle or late third of the layers only (``relay@band=...``); relay in each layer type only when the model has
several (``relay@layer_type=*`` expands to ``relay@layer_type=sliding_attention`` and
``relay@layer_type=full_attention`` on Gemma-3, to nothing on single-type models such as SmolLM2); ``key_only``
everywhere. Answers, scores and the evidence probes as in the other analyses; ``--sweep layers`` adds the per-layer
causal sweep (:mod:`relaylens.probes.layer_sweep`). Not an experiment of the paper: its ``paper`` preset runs the same
conditions with the paper's memory-task decoding and gold granularity.
"""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, PAPER_DECODING, QWEN, Preset
from relaylens.experiments.specs import ExperimentSpec

SCOPES = ("relay@band=early", "relay@band=middle", "relay@band=late", "relay@layer_type=*")
CONDITIONS = ("original", "relay") + SCOPES + ("key_only",)

SPEC = ExperimentSpec(
    "layer_scope",
    selectors=("bm25",),
    budgets=(0.10,),
    conditions=CONDITIONS,
    probes=True,
    teacher_forcing=True,
    limit=8,
    figures=("layer_scope",),
    description="Relay in some layers only (per band, per layer type), original elsewhere: accuracy and final-token "
    "evidence share against original, with paired bootstrap intervals; optional per-layer causal sweep.",
)

PRESETS = {"paper": Preset(
    dict(selectors=("bm25",), budgets=(0.10,), conditions=CONDITIONS, limit=0, **PAPER_DECODING),
    paper_model=f"not in the paper; its models: {LLAMA}; {QWEN}", paper_data="LongMemEval-S (not in the paper)",
    metric="judge, probes",
    notes="Not an experiment of the paper (issue 17): the paper's decoding and session gold on the layer scopes.")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
