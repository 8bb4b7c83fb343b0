"""Which layers carry the RoPERelay effect: relay in one band or one layer type only, everything else original.

Conditions (one BM25 10% selection per record, shared): ``original``; ``relay`` everywhere; relay in the early,
middle or late third of the layers only (``relay@band=...``); relay in each layer type only when the model has
several (``relay@layer_type=*`` expands to ``relay@layer_type=sliding_attention`` and
``relay@layer_type=full_attention`` on Gemma-3, to nothing on single-type models such as SmolLM2); ``key_only``
everywhere. Answers, scores and the evidence probes as in the other analyses; ``--sweep layers`` adds the per-layer
causal sweep (:mod:`relaylens.layer_sweep`).
"""

from relaylens.experiments import ExperimentSpec

SCOPES = ("relay@band=early", "relay@band=middle", "relay@band=late", "relay@layer_type=*")

SPEC = ExperimentSpec(
    "layer_scope",
    selectors=("bm25",),
    budgets=(0.10,),
    conditions=("original", "relay") + SCOPES + ("key_only",),
    probes=True,
    teacher_forcing=True,
    limit=8,
    figures=("layer_scope",),
    description="Relay in some layers only (per band, per layer type), original elsewhere: accuracy and final-token "
    "evidence share against original, with paired bootstrap intervals; optional per-layer causal sweep.",
)
