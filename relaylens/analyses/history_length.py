"""Gain vs history length (not in the paper): one run per history length, original vs RoPERelay at 10%, with the
final-question-token probes; ``relaylens figures RUN_2K RUN_4K RUN_8K --out DIR`` then draws ``history_length``
(relay - original accuracy and evidence share per run, paired 95% cluster-bootstrap intervals) across the runs.

The paper argues that wider gaps between the kept states give compaction more room; longer histories at the same
ratio widen the gaps, so this measures the argument. Each run alone draws ``table1`` / ``table8`` (its paired
difference); the cross-run figure needs two or more runs whose histories differ in length.
"""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, PAPER_DECODING, QWEN, Preset
from relaylens.experiments.specs import ExperimentSpec

SPEC = ExperimentSpec(
    "history_length",
    selectors=("bm25", "snapkv"),
    budgets=(0.10,),
    conditions=("original", "relay"),
    probes=True,
    limit=8,
    figures=("table1", "table8", "history_length", "history_length_table"),
    description="BM25 and SnapKV at 10%, original vs relay, with final-question-token probes; one run per history "
                "length feeds the cross-run 'gain vs history length' figure.",
)

PRESETS = {"paper": Preset(
    dict(selectors=("bm25", "snapkv"), budgets=(0.10,), conditions=("original", "relay"), limit=0,
         **PAPER_DECODING),
    paper_model=f"not in the paper; its models: {LLAMA}; {QWEN}",
    paper_data="LongMemEval-schema sets at several history lengths (not in the paper)",
    notes="Not an experiment of the paper (issue 30): one run per history length (e.g. relaylens data synth at "
          "2k / 4k / 8k tokens), then relaylens figures over all the runs.")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
