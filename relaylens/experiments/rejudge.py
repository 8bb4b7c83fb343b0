"""``relaylens judge RUN_DIR``: re-score a finished run's answers with another judge, never touching generations.

Each answer of the run is judged (blinded, :mod:`relaylens.scoring.judge`) and two score rows are added per answer:
``judge_<name>`` (1/0, NaN on failure) and ``judge_<name>_failed`` (1/0); summaries (HelloBench records) are judged
by checklist instead (:mod:`relaylens.scoring.checklist`; give ``--max-tokens 2048``: the reply lists every item) and
add ``quality_<name>``, ``factuality_<name>``, ``coverage_<name>`` and ``checklist_failed_<name>``. Rows of an earlier
pass with the same name are replaced; answers, probes and every other score are rewritten unchanged (so
``answers.parquet`` is byte-identical). Malformed replies count as failures and are listed
(``RUN_DIR/judge_<name>_failures.json``). The judge's settings go to ``RUN_DIR/judges.json``; its verdicts are cached in
``RUN_DIR/judge_cache_<name>.jsonl``, so an interrupted pass resumes without new calls. The pass is recorded there as
incomplete before the first unit is rewritten and as complete after the last (:mod:`relaylens.results.passes`): until
then its scores are not shown, and reports name the interrupted pass.

Example:
    $ relaylens judge runs/main_table --judge-url http://127.0.0.1:8000/v1 --judge-model gpt-oss-20b \\
        --max-tokens 2048 --reasoning-effort medium --name gpt_oss_20b
"""

from __future__ import annotations

import datetime
import json
import re
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from relaylens.datasets import load_records, resolve_data
from relaylens.errors import RelaylensError, shown
from relaylens.results.atomic import write_atomic
from relaylens.results.passes import begin_pass, finish_pass
from relaylens.results.store import RunStore, UnitKey, file_sha256
from relaylens.scoring import judge as judge_module
from relaylens.scoring import longmemeval_judge as lme
from relaylens.scoring.checklist import CHECKLIST_MAX_TOKENS, CHECKLIST_METRICS, ChecklistJudge, is_checklist_record
from relaylens.scoring.judge import Judge
from relaylens.scoring.longmemeval_judge import TEMPLATE, LongMemEvalJudge, pass_name

__all__ = ["RejudgeResult", "rejudge_run", "judge_name", "check_judge_name", "records_of_run", "check_template_records"]

_NAME = re.compile(r"^[a-z0-9][a-z0-9_]*$")


def judge_name(text: str) -> str:
    """A metric-safe judge name from ``text`` (a model name): lowercase letters, digits and ``_``.

    >>> judge_name("openai/gpt-oss-20b")
    'gpt_oss_20b'
    """
    name = re.sub(r"[^a-z0-9]+", "_", text.rsplit("/", 1)[-1].lower()).strip("_")
    if not _NAME.fullmatch(name or ""):
        raise RelaylensError(f"cannot make a judge name from {text!r}; pass --name with letters, digits and _")
    return name


def check_judge_name(name: str) -> str:
    """``name`` when it is a judge name (the whole of it lowercase letters, digits and ``_``, not starting with
    ``_``); a :class:`~relaylens.errors.RelaylensError` otherwise. A trailing newline is no exception.

    >>> check_judge_name("gpt_oss_20b")
    'gpt_oss_20b'
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RelaylensError(f"judge name {shown(repr(name))} must be lowercase letters, digits and _ only, starting "
                             "with a letter or digit (it becomes the metric judge_NAME). Fix: pass --name with only "
                             "those characters, e.g. --name gpt_oss_20b")
    return name


@dataclass
class RejudgeResult:
    """What a re-judging pass did: answers judged, failures (listed), backend calls and cache hits, and the score
    metrics it wrote (``judge_<name>``, ``judge_<name>_failed`` for questions; ``quality_<name>`` ... for summaries)."""

    name: str
    judged: int = 0
    failures: list[dict] = field(default_factory=list)
    calls: int = 0
    cache_hits: int = 0
    metrics: list[str] = field(default_factory=list)


def records_of_run(manifest: dict, data: str | Path | None = None) -> dict:
    """``{record_id: Record}`` of the dataset a run used (``data`` overrides the manifest's path; its checksum must
    match the one the run recorded)."""
    dataset = manifest.get("dataset") or {}
    path = resolve_data(str(data)) if data is not None else Path(dataset.get("path", ""))
    if not path.is_file():
        raise RelaylensError(f"the run's dataset {path} is not there. Fix: pass --data with the same file the run used")
    if dataset.get("sha256") and file_sha256(path) != dataset["sha256"]:
        raise RelaylensError(f"{path} is not the dataset the run used (sha256 differs from the manifest's). Fix: pass "
                             "--data with the original file")
    fmt = (manifest.get("config", {}).get("run", {}) or {}).get("data_format", "auto")
    return {r.record_id: r for r in load_records(path, format=fmt)}


def _rows(columns: dict[str, list]) -> list[dict]:
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*(columns[n] for n in names))]


def check_template_records(run_dir: str | Path, template: str, data: str | Path | None = None) -> dict:
    """``{record_id: Record}`` of the run (:func:`records_of_run`), refused for the ``longmemeval`` template when a
    record the run planned has no LongMemEval question type -- before any judge call (and, from the command line,
    before the judge model loads)."""
    manifest = RunStore.open(run_dir).manifest
    records = records_of_run(manifest, data)
    if lme.check_template(template) == lme.TEMPLATE:
        planned = (manifest.get("plan") or {}).get("record_ids") or list(records)
        lme.check_records([records[i] for i in planned if i in records])
    return records


def rejudge_run(run_dir: str | Path, backend, name: str, data: str | Path | None = None,
                progress: Callable[[int, int], None] | None = None, template: str = "memory_judge_v1") -> RejudgeResult:
    """Judge every answer of ``run_dir`` with ``backend`` and store the verdicts as ``judge_<name>`` scores.

    ``template="longmemeval"``: LongMemEval's own prompts (:mod:`relaylens.scoring.longmemeval_judge`; give the backend
    10 tokens); the pass is named ``lme_<name>`` (scores ``judge_lme_<name>``), and the run's records must all be
    LongMemEval's."""
    check_judge_name(name)
    name = pass_name(template, name)
    run_dir = Path(run_dir)
    store = RunStore.open(run_dir)
    records = check_template_records(run_dir, template, data)
    _warn_short_checklist_replies(records, backend)

    metric, failed_metric = f"judge_{name}", f"judge_{name}_failed"
    checklist_metrics = [f"{m}_{name}" for m in (*CHECKLIST_METRICS, "checklist_failed")]
    result, written = RejudgeResult(name), {}
    with _lock(run_dir):
        store.invalidate()  # from here on the consolidated tables may no longer describe the units
        begin_pass(run_dir, name, [metric, failed_metric, *checklist_metrics],
                   {**_judge_settings(name, backend), "template": template})
        judge = (LongMemEvalJudge(backend, cache_path=run_dir / f"judge_cache_{name}.jsonl", metric="judge")
                 if template == TEMPLATE else Judge(backend, cache_path=run_dir / f"judge_cache_{name}.jsonl"))
        checklist = ChecklistJudge(backend, cache_path=run_dir / f"judge_cache_checklist_{name}.jsonl")
        paths = store.unit_paths()
        for done, path in enumerate(paths, 1):
            tables = store.load_unit(path)  # raw column lists: rewritten exactly as stored
            answers = _rows(tables["answers"])
            if not answers:
                continue
            scores = [row for row in _rows(tables["scores"])
                      if row["metric"] not in (metric, failed_metric, *checklist_metrics)]
            for row in answers:
                record = records.get(row["record_id"])
                if record is None:
                    raise RelaylensError(f"record {row['record_id']} of the run is not in the dataset. Fix: pass "
                                         "--data with the file the run used")
                meta = {k: row[k] for k in ("record_id", "selector", "budget", "condition", "question_type",
                                            "is_abstention", "cluster_id")}
                if is_checklist_record(record):  # summaries: HelloEval checklist scores, suffixed with the name
                    verdict = checklist.judge(record, row["answer"])
                    new = {f"{m}_{name}": v for m, v in verdict.scores().items()}
                else:
                    verdict = judge.judge(record, row["answer"])
                    values = verdict.scores()
                    new = {metric: values["judge"], failed_metric: values["judge_failed"]}
                scores += [{**meta, "metric": m, "value": v} for m, v in new.items()]
                written.update(dict.fromkeys(new))
                result.judged += 1
                if verdict.failed:
                    result.failures.append({**{k: row[k] for k in ("record_id", "selector", "budget", "condition")},
                                            "reply": verdict.raw[:200], "error": verdict.error})
            key = UnitKey(answers[0]["record_id"], answers[0]["selector"], answers[0]["budget"])
            store.write_unit(key, answers, scores, _rows(tables["probes"]), replace=True,
                             skipped_rows=_rows(tables["skipped"]), geometry_rows=_rows(tables["geometry"]),
                             machine=store.unit_machine(path))  # still the machine that computed the answers
            if progress:
                progress(done, len(paths))
        result.metrics = sorted(written)
        result.calls = judge.stats["calls"] + checklist.stats["calls"]
        result.cache_hits = judge.stats["cache_hits"] + checklist.stats["cache_hits"]
        _write_json(run_dir / f"judge_{name}_failures.json", result.failures)
        main = next((m for m in (metric, f"quality_{name}") if m in result.metrics), metric)
        finish_pass(run_dir, name, {"metric": main, "metrics": result.metrics or [metric, failed_metric],
                                    "answers": result.judged, "failures": len(result.failures), "at": _now()})
        store.consolidate()
    return result


def _warn_short_checklist_replies(records: dict, backend) -> None:
    """Checklist replies list every item: a judge limited to a few dozen output tokens cuts them off (failures)."""

    limit = getattr(backend, "max_tokens", None)
    if limit is not None and limit < 512 and any(is_checklist_record(r) for r in records.values()):
        warnings.warn(f"the run holds summaries judged by checklist, but the judge may answer with at most {limit} "
                      f"tokens: replies will be cut off and counted as failures. Fix: --max-tokens "
                      f"{CHECKLIST_MAX_TOKENS}", stacklevel=3)


def _lock(run_dir: Path):
    try:
        from relaylens.results.locks import run_lock  # noqa: PLC0415 - optional/platform: imported inside try/except ImportError
    except ImportError:  # the run-directory lock module is not present in this checkout
        return nullcontext()
    return run_lock(run_dir, "judge")


def _write_json(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _judge_settings(name: str, backend) -> dict:
    """What ``judges.json`` records about a judge: its metric, model, URL (credentials removed) and settings."""
    url = getattr(backend, "shown_url", None) or getattr(backend, "url", None)
    if url:
        redact = getattr(judge_module, "redact_url", None)
        url = redact(url) if redact else url.split("?", 1)[0]
    return {"metric": f"judge_{name}", "model_id": backend.model_id, "url": url,
            "max_tokens": getattr(backend, "max_tokens", None),
            "reasoning_effort": getattr(backend, "reasoning_effort", None), "at": _now()}
