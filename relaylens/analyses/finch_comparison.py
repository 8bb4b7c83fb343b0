"""Table 7: FINCH (a compression pipeline that assigns compact coordinates to prompt-guided retained states) vs
BM25 / PyramidKV / ChunkKV with RoPERelay, at 10% retention, on the same records with the same decoding and scoring.

FINCH runs under its own coordinates (:attr:`relaylens.selectors.Finch.coordinates`, ``rank_sync``: kept states
at ``0..K-1``, question from ``K``; with FINCH's equal per-head counts this is also what ``relay`` gives). The other
selectors run under ``relay``; every selector also runs under ``original`` for reference. Table 7 pairs each
selector-with-relay against FINCH on the same records (cluster-bootstrap intervals).
"""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, PAPER_DECODING, Preset
from relaylens.experiments.specs import ExperimentSpec

SPEC = ExperimentSpec(
    "finch_comparison",
    selectors=("finch", "bm25", "pyramidkv", "chunkkv"),
    budgets=(0.10,),
    conditions=("original", "relay", "rank_sync"),
    limit=8,
    figures=("table7",),
    description="FINCH under its own compact coordinates vs BM25 / PyramidKV / ChunkKV + RoPERelay at 10%.",
)

PRESETS = {"paper": Preset(
    dict(selectors=("finch", "bm25", "pyramidkv", "chunkkv"), budgets=(0.10,),
         conditions=("original", "relay", "rank_sync"),
         limit=0, **PAPER_DECODING),
    paper_model=LLAMA, paper_data="LongMemEval-S 500, PersonaMem 200",
    metric="judge, F1, choice accuracy (PersonaMem)",
    notes="FINCH chunks of 512 tokens, rows normalised as FinchPress; FINCH reported under its own coordinates "
          "(rank_sync), the others under relay.")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
