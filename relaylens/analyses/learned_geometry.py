"""What geometry does the model want? Fit the geometry family (:mod:`relaylens.conditions.family`: per (layer, kv
head) the distance ``b`` from the last kept key to the question, a gap scale ``s`` and a mix ``alpha`` of source and
unit gaps) by gradient ascent on the teacher-forced log-likelihood of the reference answer over train records, then
compare the learned map with ``original`` and ``relay`` on held-out test records with the same BM25 10% selection.

Runs through :func:`relaylens.experiments.learned_run.run_learned_geometry` (the record's ``run``), not the sweep
runner; its options (:class:`~relaylens.experiments.learned.LearnOptions`: steps, learning rate, sharing, records per
step, evaluation interval, train fraction, answer tokens) are the flags this module declares (``FLAGS``), which
``relaylens run learned_geometry`` takes; the split and the per-step draws use ``--seed``. Not an experiment of the
paper.
"""

from relaylens.experiments.analysis import Analysis, CliOption
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

PRESETS = {"paper": Preset(
    dict(selectors=("bm25",), budgets=(0.10,), conditions=("original", "relay"), limit=0, max_new_tokens=32,
         prompt_mode="auto", granularity="session"),
    paper_model="not in the paper; Qwen2.5-Coder-0.5B-Instruct in bfloat16 on a 2-core CPU",
    paper_data="96 LongMemEval-schema records (not in the paper)",
    metric="answer log-likelihood, contains / F1, probes",
    notes="Not an experiment of the paper (issue 31): 48 train / 48 test records (a 96-record file, e.g. relaylens "
          "data synth --n 96), BM25 10%, chat prompts where the model has a template, session gold.")}

#: the command-line flags of ``relaylens run learned_geometry`` (each sets one field of LearnOptions)
FLAGS = (
    CliOption("steps", int, "Adam steps (default 40)"),
    CliOption("learning_rate", float, "Adam step size on log b, log s and alpha (default 0.05)"),
    CliOption("sharing", str, "parameters shared: global, layer (default) or head"),
    CliOption("batch_records", int, "train records per step (default 8; 0: all)"),
    CliOption("eval_every", int, "steps between test log-likelihoods (default 10)"),
    CliOption("train_fraction", float, "share of the records (whole clusters) that train (default 0.5; the split is "
              "seeded by --seed)"),
    CliOption("answer_tokens", int, "reference-answer tokens teacher-forced per record (default 16)",
              field="max_answer_tokens"),
)

ANALYSIS = Analysis(SPEC, PRESETS, run=run_learned_geometry, options=LearnOptions(), cli_options=FLAGS,
                    cli_panel="Learned geometry (learned_geometry only)", doc=__doc__)
