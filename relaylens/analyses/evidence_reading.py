"""Figure 6: how the final question token reads the gold evidence under original, half_gap and relay."""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import PAPER_DECODING, QWEN, Preset
from relaylens.experiments.specs import ALPHA_CURVE, ExperimentSpec

SPEC = ExperimentSpec(
    "evidence_reading",
    selectors=("snapkv", "bm25"),
    budgets=(0.10,),
    conditions=("original", "half_gap", "relay"),
    replay_conditions=("original", "half_gap", "relay") + ALPHA_CURVE,
    probes=True,
    teacher_forcing=True,
    attribution=True,
    limit=8,
    figures=("figure6",),
    description="Per-layer evidence attention share, evidence value norm and phase-replay gold share, at the final "
    "question token and the teacher-forced first answer token, with the compaction(alpha) curve; evidence attribution "
    "to the answer (gradient x input, direct logit attribution).",
)

PRESETS = {"paper": Preset(
    dict(selectors=("bm25",), budgets=(8192,), conditions=("original", "half_gap", "relay"),
         replay_conditions=("original", "half_gap", "relay") + ALPHA_CURVE, probes=True, teacher_forcing=True,
         limit=0, **PAPER_DECODING),
    paper_model=QWEN + ", 28 layers", paper_data="LongMemEval-S 500", metric="probes",
    notes="gold = retained states inside answer_session_ids sessions; bands early/middle/late thirds.")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
