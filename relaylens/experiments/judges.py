"""The judges of a run: the optional LLM judge built from a :class:`~relaylens.experiments.config.RunConfig`
(an endpoint, a local Hugging Face model, or the deterministic checklist stub).
"""

from __future__ import annotations

from pathlib import Path

from relaylens.errors import RelaylensError
from relaylens.experiments.config import RunConfig


def make_judge(config: RunConfig, run_dir: Path):
    """The optional LLM judge of a run (None without one): the ``memory_judge_v1`` verdict for question records and
    HelloEval checklist judging (:mod:`relaylens.scoring.checklist`, 2,048 output tokens) for summarization records, cached in
    ``RUN_DIR/judge_cache.jsonl`` and ``RUN_DIR/judge_cache_checklist.jsonl``. ``--judge-model stub`` (no URL) is
    the deterministic local checklist stub (tests and CPU demos; question records then get no verdict)."""
    from relaylens.scoring.checklist import CHECKLIST_MAX_TOKENS, ChecklistJudge, RoutedJudge, StubChecklistBackend
    from relaylens.scoring.judge import HFBackend, Judge, OpenAIBackend

    if not config.judge_model and not config.judge_url:
        return None
    checklist_cache = run_dir / "judge_cache_checklist.jsonl"
    if config.judge_model == "stub" and not config.judge_url:
        return RoutedJudge(None, ChecklistJudge(StubChecklistBackend(), cache_path=checklist_cache))
    if config.judge_url:
        if not config.judge_model:
            raise RelaylensError("--judge-url needs --judge-model (the model name the endpoint serves)")
        backend = OpenAIBackend(config.judge_url, config.judge_model, api_key_env=config.judge_key_env)
        long = OpenAIBackend(config.judge_url, config.judge_model, api_key_env=config.judge_key_env,
                             max_tokens=CHECKLIST_MAX_TOKENS)
    else:
        from relaylens.model.loading import load_model

        model, tokenizer = load_model(config.judge_model)
        backend = HFBackend(model, tokenizer, model_id=config.judge_model)
        long = HFBackend(model, tokenizer, model_id=config.judge_model, max_tokens=CHECKLIST_MAX_TOKENS)
    return RoutedJudge(Judge(backend, cache_path=run_dir / "judge_cache.jsonl"),
                       ChecklistJudge(long, cache_path=checklist_cache))
