"""Table 1: six selectors x {original, relay} at 10% retention."""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, PAPER_DECODING, QWEN, SIX_SELECTORS, Preset
from relaylens.experiments.specs import ExperimentSpec

SPEC = ExperimentSpec(
    "main_table",
    selectors=("bm25", "snapkv", "h2o", "pyramidkv", "chunkkv", "cam"),
    budgets=(0.10,),
    conditions=("original", "relay"),
    limit=8,
    figures=("table1",),
    description="Answer quality of six selectors at 10% retention, original vs RoPERelay coordinates.",
)

PRESETS = {"paper": Preset(
    dict(selectors=SIX_SELECTORS, budgets=(0.10,), conditions=("original", "relay"), limit=0, **PAPER_DECODING),
    paper_model=f"{LLAMA}; {QWEN}", paper_data="LongMemEval-S 500, LongMTBench+ 88, PersonaMem-128K 200",
    metric="judge (LME-S, LongMTBench+) / choice accuracy (PersonaMem)",
    notes="FullKV quoted as a reference (full_kv analysis).")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
