"""The scoring stage: answer metrics (equal to each benchmark's own code where they carry its name), the LLM judge,
HelloEval checklists and judge agreement.

Owns: :mod:`~relaylens.scoring.metrics` (normalisation, exact match, F1, containment, choice extraction, abstention;
:func:`score_answer`), :mod:`~relaylens.scoring.judge` (the blinded ``memory_judge_v1`` judge and its HTTP client,
whose exchange -- no redirects, a wall-clock deadline, a reply size cap -- is :mod:`~relaylens.scoring.transport`),
:mod:`~relaylens.scoring.longmemeval_judge` (the second template: LongMemEval's own per-type yes/no prompts),
:mod:`~relaylens.scoring.checklist` (checklist judging of summaries) and
:mod:`~relaylens.scoring.agreement` (raw agreement, Cohen's kappa). Re-judging a finished run (``relaylens judge
RUN_DIR``) drives a run directory, its dataset and a judge, so it sits with the other commands in
:mod:`relaylens.experiments.rejudge`.

In: a record (:mod:`relaylens.datasets.records`) and an answer. Out: metric values and verdicts (rows of the
``scores`` table, :mod:`relaylens.results.tables`).

May import: :mod:`relaylens.errors`, :mod:`relaylens.fileio` (the verdict caches, never through a link) and
:mod:`relaylens.model.tokens` (a local judge tokenises question, references and candidate as data) only;
importing this package imports no torch (a local judge model is built by the caller and passed in as a backend).

Exports the stage contract: :func:`score_answer` and :func:`normalize_answer` (what the datasets stage uses to refuse
a reference that normalises to nothing). The other names of the former module ``relaylens.scoring`` (now
:mod:`relaylens.scoring.metrics`) still resolve here, with a warning, until relaylens 0.3.0
(:data:`relaylens.MOVED_NAMES`).
"""

from relaylens import moved_name
from relaylens.scoring.metrics import normalize_answer, score_answer

__all__ = ["normalize_answer", "score_answer"]


def __getattr__(name: str):  # names of the flat module this package replaced, until relaylens.REMOVED_IN
    return moved_name(__name__, name)
