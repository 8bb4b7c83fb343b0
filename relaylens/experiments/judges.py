"""The judges of a run: the optional LLM judge built from a :class:`~relaylens.experiments.config.RunConfig`
(an endpoint, a local Hugging Face model, or the deterministic checklist stub).
"""

from __future__ import annotations

from pathlib import Path

from relaylens.errors import RelaylensError
from relaylens.experiments.config import RunConfig, run_records
from relaylens.scoring import longmemeval_judge as lme
from relaylens.scoring.checklist import CHECKLIST_MAX_TOKENS, ChecklistJudge, RoutedJudge, StubChecklistBackend
from relaylens.scoring.judge import MAX_NEW_TOKENS, HFBackend, Judge, OpenAIBackend


def make_judge(config: RunConfig, run_dir: Path, records=None):
    """The optional LLM judge of a run (None without one): the ``memory_judge_v1`` verdict for question records and
    HelloEval checklist judging (:mod:`relaylens.scoring.checklist`, 2,048 output tokens) for summarization records,
    cached in ``RUN_DIR/judge_cache.jsonl`` and ``RUN_DIR/judge_cache_checklist.jsonl``. ``--judge-model stub`` (no URL)
    is the deterministic local checklist stub (tests and CPU demos; question records then get no verdict).

    ``config.judge_template == "longmemeval"``: LongMemEval's own per-type yes/no prompts instead
    (:mod:`relaylens.scoring.longmemeval_judge`; 10 tokens, scores ``judge_lme``, cached in
    ``RUN_DIR/judge_cache_lme.jsonl``), for LongMemEval records only: ``records``, when given, are checked here, and
    the judge refuses any other record before calling its backend."""
    if not config.judge_model and not config.judge_url:
        return None
    official = lme.check_template(config.judge_template) == lme.TEMPLATE
    if official and records is not None:
        lme.check_records(records)
    checklist_cache = run_dir / "judge_cache_checklist.jsonl"
    if config.judge_model == "stub" and not config.judge_url:
        if official:
            raise RelaylensError("--judge-model stub judges summaries by checklist only; it has no LongMemEval "
                                 "verdict. Fix: give a judge model (--judge-model NAME, with --judge-url for an "
                                 "endpoint)")
        return RoutedJudge(None, ChecklistJudge(StubChecklistBackend(), cache_path=checklist_cache))
    short = lme.MAX_NEW_TOKENS if official else MAX_NEW_TOKENS
    if config.judge_url:
        if not config.judge_model:
            raise RelaylensError("--judge-url needs --judge-model (the model name the endpoint serves)")
        backend = OpenAIBackend(config.judge_url, config.judge_model, api_key_env=config.judge_key_env,
                                max_tokens=short)
        long = OpenAIBackend(config.judge_url, config.judge_model, api_key_env=config.judge_key_env,
                             max_tokens=CHECKLIST_MAX_TOKENS)
    else:
        from relaylens.model.loading import load_model  # noqa: PLC0415 - late binding (tests swap loading.load_model); import cost: torch loads on first use

        model, tokenizer = load_model(config.judge_model)
        backend = HFBackend(model, tokenizer, model_id=config.judge_model, max_tokens=short)
        long = HFBackend(model, tokenizer, model_id=config.judge_model, max_tokens=CHECKLIST_MAX_TOKENS)
    if official:
        return lme.LongMemEvalJudge(backend, cache_path=run_dir / "judge_cache_lme.jsonl")
    return RoutedJudge(Judge(backend, cache_path=run_dir / "judge_cache.jsonl"),
                       ChecklistJudge(long, cache_path=checklist_cache))


def check_judge_records(spec, config: RunConfig) -> None:
    """Refuse a ``longmemeval`` judge on records without LongMemEval question types before any model loads: the
    records the run would read (:func:`~relaylens.experiments.config.run_records`), all of them checked
    (:func:`relaylens.scoring.longmemeval_judge.check_records`). Nothing to check without a judge or with
    ``memory_judge_v1``."""
    if lme.check_template(config.judge_template) != lme.TEMPLATE or not (config.judge_model or config.judge_url):
        return
    lme.check_records(run_records(spec, config)[1])  # the records the run reads, in its order (issue 53)
