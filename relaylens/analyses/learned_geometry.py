"""What geometry does the model want? Fit the geometry family (:mod:`relaylens.conditions.family`: per (layer, kv
head) the distance ``b`` from the last kept key to the question, a gap scale ``s`` and a mix ``alpha`` of source and
unit gaps) by gradient ascent on the teacher-forced log-likelihood of the reference answer over train records, then
compare the learned map with ``original`` and ``relay`` on held-out test records with the same BM25 10% selection.

Runs through :func:`relaylens.experiments.learned_run.run_learned_geometry` (``RUN``), not the sweep runner; its
options (``OPTIONS``: steps, learning rate, sharing, records per step, evaluation interval, train fraction, answer
tokens) are CLI flags of ``relaylens run learned_geometry``; the split and the per-step draws use ``--seed``. Not an
experiment of the paper.
"""

from relaylens.experiments.learned import LearnOptions
from relaylens.experiments.learned_run import run_learned_geometry
from relaylens.experiments.presets import Preset
from relaylens.experiments.specs import ExperimentSpec

SPEC = ExperimentSpec(
    "learned_geometry",
    selectors=("bm25",),
    budgets=(0.10,),
    conditions=("original", "relay"),
    probes=True,
    sensitivity=True,
    max_new_tokens=32,
    limit=16,
    figures=("learned_geometry", "learned_table", "positional_sensitivity"),
    description="Learn b, s, alpha per layer by gradient ascent on the answer log-likelihood (train split), then "
    "original vs relay vs learned on the test split: answer log-likelihood, contains/F1, evidence share, sensitivity.",
)

#: the defaults of the learned_geometry options (CLI flags override them)
OPTIONS = LearnOptions()

#: this analysis runs through its own runner
RUN = run_learned_geometry

PRESETS = {"paper": Preset(
    dict(selectors=("bm25",), budgets=(0.10,), conditions=("original", "relay"), limit=0, max_new_tokens=32,
         prompt_mode="auto", granularity="session"),
    paper_model="not in the paper; Qwen2.5-Coder-0.5B-Instruct in bfloat16 on a 2-core CPU",
    paper_data="96 LongMemEval-schema records (not in the paper)",
    metric="answer log-likelihood, contains / F1, probes",
    notes="Not an experiment of the paper (issue 31): 48 train / 48 test records (a 96-record file, e.g. relaylens "
          "data synth --n 96), BM25 10%, chat prompts where the model has a template, session gold.")}
