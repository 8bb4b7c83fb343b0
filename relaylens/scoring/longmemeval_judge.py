"""LongMemEval's own judge protocol (``src/evaluation/evaluate_qa.py`` of xiaowu0162/LongMemEval), the judge template
``longmemeval`` beside the paper's ``memory_judge_v1`` (:mod:`relaylens.scoring.judge`).

What the benchmark's script does, and so what this template does:

* **One user message**, no system prompt, temperature 0 (greedy), at most :data:`MAX_NEW_TOKENS` (10) new tokens.
* **Five prompt shapes** (:data:`PROMPTS`), reproduced character for character (they are protocol text: numbers
  are comparable with the LongMemEval literature only under the same words): ``single-session-user``,
  ``single-session-assistant`` and ``multi-session`` share one; ``temporal-reasoning`` adds that off-by-one errors in
  day / week / month counts are not penalised; ``knowledge-update`` accepts earlier information beside the updated
  answer; ``single-session-preference`` judges against a rubric; **abstention** is chosen by ``'_abs' in
  question_id`` -- the id, not the question type (an abstention record keeps its base type; routing by type would
  use the wrong rubric).
* **The verdict is** ``'yes' in reply.lower()``: a substring test, so ``"Yes."`` and ``"YES"`` are correct, ``"no"``
  is not, and -- a quirk kept on purpose, because the benchmark's numbers include it -- so is any reply that merely
  *contains* the letters "yes": ``"eyes"``, ``"no, not yes"``. Every reply is a verdict; only a transport failure
  (the backend answered nothing) is a judge failure (``judge_lme`` NaN, ``judge_lme_failed`` 1).
* The reference is the file's ``answer`` as the script formats it (``str`` of the JSON value: ``3`` stays ``3``),
  the response the model's answer as generated.

Only LongMemEval records can be judged this way: a record whose ``question_type`` is not one of the six
(:data:`QUESTION_TYPES`; InfiniteBench, PersonaMem, summaries, ...) is refused before any backend call
(:func:`check_records`). Verdicts are cached under ``sha256(template name + prompt + judge model + settings)``, so the
two templates never share one. The metrics the benchmark's ``print_qa_metrics.py`` reports (per type, task-averaged,
overall, abstention) are the ``longmemeval_metrics`` table (:mod:`relaylens.reporting.figures.longmemeval_metrics`).

Example:
    >>> record = {"record_id": "e47becba_abs", "question": "Where did I go?", "answers": ["You did not say."],
    ...           "question_type": "multi-session"}
    >>> prompt_kind(record), build_prompt(record, "I don't know.").splitlines()[0][:40]
    ('abstention', 'I will give you an unanswerable question')
    >>> parse_verdict("Yes."), parse_verdict("no"), parse_verdict("eyes")
    (True, False, True)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relaylens.errors import RelaylensError, shown
from relaylens.scoring.judge import JudgeBackendError, JudgeCache
from relaylens.scoring.metrics import record_field, record_references

__all__ = ["TEMPLATE", "TEMPLATES", "DEFAULT_TEMPLATE", "METRIC", "QUESTION_TYPES", "MAX_NEW_TOKENS", "PROMPTS",
           "PROMPT_OF_TYPE", "check_template", "pass_name", "prompt_kind", "reference_text", "build_prompt",
           "parse_verdict", "cache_key", "check_record", "check_records", "LongMemEvalVerdict", "LongMemEvalCache",
           "LongMemEvalJudge"]

TEMPLATE = "longmemeval"
DEFAULT_TEMPLATE = "memory_judge_v1"
TEMPLATES = (DEFAULT_TEMPLATE, TEMPLATE)
"""The judge templates relaylens knows (``--judge-template``): the paper's and LongMemEval's own."""
METRIC = "judge_lme"
"""The scores metric of this template in a run (``judge_lme_failed``: transport failures); ``relaylens judge`` writes
``judge_lme_<name>``. Never ``judge``: a run can hold both templates' verdicts."""
QUESTION_TYPES = ("single-session-user", "single-session-preference", "single-session-assistant", "multi-session",
                  "temporal-reasoning", "knowledge-update")
"""The six LongMemEval question types, in the order ``print_qa_metrics.py`` prints them."""
MAX_NEW_TOKENS = 10

_ASK = "\n\nModel Response: {response}\n\nIs the model response correct? Answer yes or no only."
PROMPTS = {
    "default": "I will give you a question, a correct answer, and a response from a model. Please answer yes if the "
               "response contains the correct answer. Otherwise, answer no. If the response is equivalent to the "
               "correct answer or contains all the intermediate steps to get the correct answer, you should also "
               "answer yes. If the response only contains a subset of the information required by the answer, answer "
               "no. \n\nQuestion: {question}\n\nCorrect Answer: {answer}" + _ASK,
    "temporal-reasoning": "I will give you a question, a correct answer, and a response from a model. Please answer "
               "yes if the response contains the correct answer. Otherwise, answer no. If the response is equivalent "
               "to the correct answer or contains all the intermediate steps to get the correct answer, you should "
               "also answer yes. If the response only contains a subset of the information required by the answer, "
               "answer no. In addition, do not penalize off-by-one errors for the number of days. If the question "
               "asks for the number of days/weeks/months, etc., and the model makes off-by-one errors (e.g., "
               "predicting 19 days when the answer is 18), the model's response is still correct. \n\nQuestion: "
               "{question}\n\nCorrect Answer: {answer}" + _ASK,
    "knowledge-update": "I will give you a question, a correct answer, and a response from a model. Please answer yes "
               "if the response contains the correct answer. Otherwise, answer no. If the response contains some "
               "previous information along with an updated answer, the response should be considered as correct as "
               "long as the updated answer is the required answer.\n\nQuestion: {question}\n\nCorrect Answer: {answer}"
               + _ASK,
    "single-session-preference": "I will give you a question, a rubric for desired personalized response, and a "
               "response from a model. Please answer yes if the response satisfies the desired response. Otherwise, "
               "answer no. The model does not need to reflect all the points in the rubric. The response is correct as "
               "long as it recalls and utilizes the user's personal information correctly.\n\nQuestion: {question}\n\n"
               "Rubric: {answer}" + _ASK,
    "abstention": "I will give you an unanswerable question, an explanation, and a response from a model. Please "
               "answer yes if the model correctly identifies the question as unanswerable. The model could say that "
               "the information is incomplete, or some other information is given but the asked information is not."
               "\n\nQuestion: {question}\n\nExplanation: {answer}\n\nModel Response: {response}\n\nDoes the model "
               "correctly identify the question as unanswerable? Answer yes or no only.",
}
"""The five prompt shapes of ``evaluate_qa.py`` (``{question}``, ``{answer}``, ``{response}`` filled in that order,
as the script's positional ``format`` does). Note the space before the first ``\\n\\n`` in ``default`` and
``temporal-reasoning`` only: it is the benchmark's."""
PROMPT_OF_TYPE = {"single-session-user": "default", "single-session-assistant": "default", "multi-session": "default",
                  "temporal-reasoning": "temporal-reasoning", "knowledge-update": "knowledge-update",
                  "single-session-preference": "single-session-preference"}


def check_template(name: str) -> str:
    """``name`` when it is a judge template (:data:`TEMPLATES`); refused otherwise, before any judge call.

    >>> check_template("longmemeval")
    'longmemeval'
    """
    if name not in TEMPLATES:
        raise RelaylensError(f"unknown judge template {shown(repr(name))}; expected one of {', '.join(TEMPLATES)}. "
                             "Fix: --judge-template memory_judge_v1 (the paper's judge, the default) or "
                             "--judge-template longmemeval (LongMemEval's own per-type yes/no prompts)")
    return name


def pass_name(template: str, name: str) -> str:
    """The ``relaylens judge`` pass name of judge ``name`` under ``template``: ``lme_<name>`` for LongMemEval's prompts
    (scores ``judge_lme_<name>``), ``name`` itself for ``memory_judge_v1``, where names ``lme`` and ``lme_*`` are
    refused (reserved, so the two templates' scores never share a metric).

    >>> pass_name("longmemeval", "q15"), pass_name("longmemeval", "lme_q15"), pass_name("memory_judge_v1", "q15")
    ('lme_q15', 'lme_q15', 'q15')
    """
    if check_template(template) == TEMPLATE:
        return name if name.startswith("lme_") else f"lme_{name}"
    if name == "lme" or name.startswith("lme_"):
        raise RelaylensError(f"judge name {shown(repr(name))} is reserved for --judge-template longmemeval (its scores "
                             "are judge_lme_*), but the template is memory_judge_v1. Fix: choose another --name, or "
                             "pass --judge-template longmemeval")
    return name


def _record_id(record: Any) -> str:
    return str(record_field(record, "record_id") or record_field(record, "question_id") or "")


def prompt_kind(record: Any) -> str:
    """The prompt shape of ``record``: ``abstention`` when ``'_abs'`` is in its id, else its question type's
    (:data:`PROMPT_OF_TYPE`); refused for a type LongMemEval does not have."""
    check_record(record)
    return "abstention" if "_abs" in _record_id(record) else PROMPT_OF_TYPE[record_field(record, "question_type")]


def reference_text(record: Any) -> str:
    """The correct answer (or rubric, or explanation) as the benchmark's script writes it into the prompt: ``str``
    of the file's ``answer`` (``raw_answer``), else the first reference answer."""
    raw = record_field(record, "raw_answer")
    if raw is not None:
        return str(raw)
    refs = record_references(record)
    refs = [refs] if isinstance(refs, str) else list(refs or [])
    return str(refs[0]) if refs else ""


def build_prompt(record: Any, candidate: str) -> str:
    """The one user message for ``record`` and the model's answer ``candidate`` (blinded: question, reference and
    answer only)."""
    template = PROMPTS[prompt_kind(record)]
    return template.format(question=record_field(record, "question", ""), answer=reference_text(record),
                           response="" if candidate is None else str(candidate))


def parse_verdict(reply: str) -> bool:
    """``'yes' in reply.lower()``, as the benchmark scores it (a substring: ``"eyes"`` counts as yes).

    >>> parse_verdict(" YES"), parse_verdict("No, it does not."), parse_verdict("")
    (True, False, False)
    """
    return "yes" in (reply or "").lower()


def cache_key(prompt: str, model_id: str, settings: dict | None = None) -> str:
    """sha256 of the template name, the prompt, the judge model id and the backend's settings: never equal to a
    ``memory_judge_v1`` key (whose blob names that template)."""
    blob = json.dumps({"template": TEMPLATE, "prompt": prompt, "model": model_id,
                       **({"settings": settings} if settings else {})}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def check_record(record: Any, others: int = 0) -> None:
    """Refuse a record LongMemEval's prompts cannot judge: its ``question_type`` is not one of :data:`QUESTION_TYPES`
    (InfiniteBench, PersonaMem, Long-MT-Bench+, summaries). ``others``: how many more records share its fate."""
    qtype = record_field(record, "question_type")
    if qtype not in PROMPT_OF_TYPE:
        source = record_field(record, "source") or "unknown source"
        more = f", and so have {others} more record(s) of the run" if others else ""
        raise RelaylensError(
            f"judge template longmemeval: record {shown(repr(_record_id(record)))} ({shown(source)}) has question "
            f"type {shown(repr(qtype))}, not one of LongMemEval's six ({', '.join(QUESTION_TYPES)}){more}; its "
            "per-type prompts have nothing to judge them by. Fix: judge this dataset with --judge-template "
            "memory_judge_v1 (the default), or run on a LongMemEval file")


def check_records(records) -> None:
    """:func:`check_record` for every record (before any call): the first refused one is named, with the count."""
    bad = [r for r in records if record_field(r, "question_type") not in PROMPT_OF_TYPE]
    if bad:
        check_record(bad[0], others=len(bad) - 1)


@dataclass(frozen=True)
class LongMemEvalVerdict:
    """One judgement: ``correct`` is None exactly when the backend failed (``error`` says why)."""

    correct: bool | None
    raw: str
    key: str
    cached: bool = False
    error: str | None = None
    metric: str = METRIC

    @property
    def failed(self) -> bool:
        return self.correct is None

    def scores(self) -> dict[str, float]:
        """``{metric: 1/0 (NaN on failure), metric_failed: 1/0}``."""
        return {self.metric: math.nan if self.failed else float(self.correct),
                f"{self.metric}_failed": float(self.failed)}


class LongMemEvalCache(JudgeCache):
    """The on-disk verdict cache of this template (its lines name ``longmemeval``)."""

    template = TEMPLATE


@dataclass
class LongMemEvalJudge:
    """LongMemEval's judge over one backend (``complete(system, user)``; called with an empty system prompt, which
    :class:`~relaylens.scoring.judge.OpenAIBackend` and :class:`~relaylens.scoring.judge.HFBackend` send as one user
    message), with an optional on-disk cache. ``metric`` names the scores (``judge_lme``);
    ``on_backend_error`` as in :class:`~relaylens.scoring.judge.Judge`."""

    backend: Any
    cache_path: str | Path | None = None
    on_backend_error: str = "raise"
    metric: str = METRIC
    stats: dict = field(default_factory=lambda: {"calls": 0, "cache_hits": 0, "failures": 0, "backend_errors": 0})

    def __post_init__(self):
        if self.on_backend_error not in ("raise", "record"):
            raise RelaylensError(f"on_backend_error must be 'raise' or 'record'; got {self.on_backend_error!r}. "
                                 "Fix: pass one of those")
        self.cache = LongMemEvalCache(self.cache_path) if self.cache_path is not None else None
        self.memory: dict[str, str] = {}

    def judge(self, record: Any, candidate: str) -> LongMemEvalVerdict:
        """Judge one answer; a record without a LongMemEval question type is refused before the backend is called."""
        prompt = build_prompt(record, candidate)
        key = cache_key(prompt, self.backend.model_id, getattr(self.backend, "settings", None))
        raw = self.memory.get(key)
        if raw is None and self.cache is not None:
            raw = self.cache.get(key)
        if raw is not None:  # an empty reply is a verdict too ("no"), cached like any other
            self.stats["cache_hits"] += 1
            return LongMemEvalVerdict(parse_verdict(raw), raw, key, cached=True, metric=self.metric)
        self.stats["calls"] += 1
        try:
            raw = self.backend.complete("", prompt)
        except JudgeBackendError as exc:
            self.stats["backend_errors"] += 1
            self.stats["failures"] += 1
            if self.on_backend_error == "raise":
                raise
            return LongMemEvalVerdict(None, "", key, error=f"backend error: {exc}", metric=self.metric)
        raw = "" if raw is None else str(raw)
        self.memory[key] = raw
        if self.cache is not None:
            self.cache.put(key, raw, self.backend.model_id)
        return LongMemEvalVerdict(parse_verdict(raw), raw, key, cached=False, metric=self.metric)
