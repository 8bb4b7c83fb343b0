"""Table 2: long-text QA on InfiniteBench (long dialogue QA, long-book multiple choice, long-book open QA), SnapKV
at 1% retention, original vs RoPERelay coordinates.

Prompts are the benchmark's own task templates (:mod:`relaylens.datasets.prompt_templates`); each task is scored with
its official metric (:data:`TASK_METRICS`); records whose history does not fit the model's range (or
``--max-history-tokens``) are skipped and listed, never run truncated. The CPU default runs the bundled
InfiniteBench-format sample (3 records per task, ~2k-token contexts) with SmolLM2; at 1% of ~2k tokens SnapKV keeps ~20
states, so the CPU default shrinks SnapKV's observation window to 8 (the paper's scale keeps the default 32).
"""

from relaylens.experiments.analysis import Analysis
from relaylens.experiments.presets import LLAMA, Preset
from relaylens.experiments.specs import ExperimentSpec

#: InfiniteBench's official metric per task, as named in the scores table (relaylens.scoring.metrics.score_answer):
#: En.Dia: the label is one of the answer's words (``contains`` for this task); En.MC: choice accuracy;
#: En.QA: SQuAD token F1 without number normalisation.
TASK_METRICS = {
    "longdialogue_qa_eng": "contains",
    "longbook_choice_eng": "choice_accuracy",
    "longbook_qa_eng": "f1",
}

SPEC = ExperimentSpec(
    "infinitebench",
    selectors=("snapkv",),
    budgets=(0.01,),
    conditions=("original", "relay"),
    max_new_tokens=40,  # InfiniteBench's generation limit for these three tasks
    prompt_mode="completion",
    selector_options={"snapkv": {"window": 8}},
    limit=6,
    figures=("table2",),
    description="InfiniteBench En.Dia / En.MC / En.QA with the benchmark's templates and metrics, SnapKV 1%, "
                "original vs RoPERelay.",
    data="sample:infinitebench",
)

PRESETS = {"paper": Preset(
    dict(selectors=("snapkv",), budgets=(0.01,), conditions=("original", "relay"), selector_options={}, limit=0,
         max_new_tokens=40, stop="eos", prompt_mode="auto"),
    paper_model=LLAMA,
    paper_data="InfiniteBench En.Dia, En.MC, En.QA, 50 each, length-filtered within 128K (records past the model's "
               "range are skipped and listed)",
    metric="the benchmark's objective metrics (En.Dia label match, En.MC choice accuracy, En.QA token F1)",
    notes="SnapKV with its default window 32; 40 new tokens, InfiniteBench's own limit for these tasks (the paper "
          "gives none); chat templates of the benchmark in chat mode.")}

ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)
