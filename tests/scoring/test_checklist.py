"""HelloEval-style checklist judging: the weighted score against a hand computation, malformed replies as recorded
failures, blinding, caching, routing, and the summarization analysis end to end on a tiny model."""

from __future__ import annotations

import json
import math

import pytest
from support.checklist_shared import short_sample  # noqa: F401 - shared with the model tier

from relaylens.datasets import load_records
from relaylens.datasets.synthetic_hellobench import bundled_hellobench_path
from relaylens.scoring.checklist import (
    ChecklistJudge,
    RoutedJudge,
    StubChecklistBackend,
    build_payload,
    parse_reply,
    user_message,
)

WEIGHTS = [7.5, 19.5, 15.25, 17.25, 16.75, 23.75]  # sum 100.0
SCORES = [1.0, 0.5, 0.75, 0.0, 0.25, 1.0]


class Scripted:
    """A judge backend that replies with fixed text and counts its calls."""

    model_id = "scripted"
    settings = {"backend": "scripted"}

    def __init__(self, reply: str):
        self.reply, self.calls, self.seen = reply, 0, []

    def complete(self, system: str, user: str) -> str:
        self.calls += 1
        self.seen.append(user)
        return self.reply


def _record():
    record = load_records(bundled_hellobench_path())[0]
    checklist = tuple(dict(item, weight=w) for item, w in zip(record.meta["checklist"], WEIGHTS))
    return record.__class__(**{**record.__dict__, "meta": {**record.meta, "checklist": checklist}})


def _reply(scores, order=None) -> str:
    ids = order or range(len(scores))
    return json.dumps([{"checklist_id": i, "reason": "r", "evaluation_score": scores[i]} for i in ids])


def test_weighted_score_equals_the_hand_computation():
    record = _record()
    aspects = [c["aspect"] for c in record.meta["checklist"]]
    assert aspects == ["other", "other", "factuality", "coverage", "other", "other"]
    verdict = ChecklistJudge(Scripted(_reply(SCORES, order=[5, 3, 1, 0, 2, 4]))).judge(record, "A summary.")
    # by hand: 7.5*1 + 19.5*0.5 + 15.25*0.75 + 17.25*0 + 16.75*0.25 + 23.75*1 = 56.625, over 100
    assert verdict.scores() == {"quality": pytest.approx(0.56625, abs=1e-12), "factuality": 0.75, "coverage": 0.0,
                                "checklist_failed": 0.0}


@pytest.mark.parametrize("reply, why", [
    ("The summary is good.", "not JSON"),
    ('{"checklist_id": 0, "evaluation_score": 1}', "not a list"),
    (_reply(SCORES[:5]), "scores 5 items"),
    (json.dumps([{"checklist_id": 0, "evaluation_score": 1}] * 6), "repeated"),
    (_reply([1.0, 0.5, 0.75, 0.0, 0.25, 1.5]), "not a number in [0, 1]"),
    (_reply([1.0, 0.5, 0.75, 0.0, 0.25, "high"]), "not a number in [0, 1]"),
    (_reply([1.0, 0.5, 0.75, 0.0, 0.25, None]), "not a number in [0, 1]"),
    (json.dumps([{"checklist_id": i + 1, "evaluation_score": 1} for i in range(6)]), "unknown checklist_id 6"),
    ('[{"checklist_id": 0, "evaluation_score": 1}', "not JSON"),
    ("", "not JSON"),
])
def test_malformed_replies_are_recorded_failures_never_zero(reply, why):
    judge = ChecklistJudge(Scripted(reply))
    verdict = judge.judge(_record(), "A summary.")
    scores = verdict.scores()
    assert verdict.failed and why in verdict.error and scores["checklist_failed"] == 1.0
    assert all(math.isnan(scores[m]) for m in ("quality", "factuality", "coverage"))
    assert judge.stats["failures"] == 1


def test_a_fenced_reply_with_string_scores_parses():
    assert parse_reply("```json\n" + _reply(["1", "0.5", "0.75", "0", "0.25", "1"]) + "\n```", 6) == SCORES


def test_payload_is_blinded_and_carries_the_source():
    record = _record()
    payload = build_payload(record, "cand")
    assert sorted(payload) == ["checklists", "instruction", "response"]
    assert record.sessions[0].turns[0].content in payload["instruction"]
    assert all(sorted(q) == ["checklist_content", "checklist_id"] for q in payload["checklists"])
    text = user_message(payload)
    for hidden in ("weight", "aspect", "selector", "condition", "budget"):  # weights, aspects and settings never shown
        assert f'"{hidden}"' not in text
    import inspect

    assert list(inspect.signature(build_payload).parameters) == ["record", "candidate"]


def test_replies_are_cached_on_disk(tmp_path):
    backend = Scripted(_reply(SCORES))
    first = ChecklistJudge(backend, cache_path=tmp_path / "cache.jsonl").judge(_record(), "A summary.")
    again = ChecklistJudge(backend, cache_path=tmp_path / "cache.jsonl").judge(_record(), "A summary.")
    assert backend.calls == 1 and again.cached and again.scores() == first.scores()


def test_stub_backend_is_deterministic_and_valid():
    record = _record()
    copied = " ".join(record.sessions[0].turns[0].content.split()[:40])
    high = ChecklistJudge(StubChecklistBackend()).judge(record, copied)
    low = ChecklistJudge(StubChecklistBackend()).judge(record, "zzzz qqqq wwww")
    empty = ChecklistJudge(StubChecklistBackend()).judge(record, "")
    assert high.scores()["quality"] == 1.0 and low.scores()["quality"] == 0.0 and empty.scores()["quality"] == 0.0


def test_routed_judge_sends_summaries_to_the_checklist_and_questions_elsewhere():
    from relaylens.datasets import bundled_sample_path

    routed = RoutedJudge(None, ChecklistJudge(Scripted(_reply(SCORES))))
    assert "quality" in routed.judge(_record(), "x").scores()
    assert routed.judge(load_records(bundled_sample_path())[0], "x").scores() == {}


def test_summarization_runs_end_to_end_with_the_stub_judge(tmp_path):
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis
    from relaylens.reporting.figures import build
    from relaylens.results.store import load_tables
    from relaylens.testing import tiny_model, tiny_tokenizer

    data = tmp_path / "summarization.jsonl"
    items = short_sample(data)
    spec = load_analysis("summarization").spec.replace(max_new_tokens=4, selector_options={"snapkv": {"window": 8}})
    out = run_analysis(spec, RunConfig(out=str(tmp_path / "run"), data=str(data), judge_model="stub"), progress=False,
                       model_and_tokenizer=(tiny_model("llama", seed=0), tiny_tokenizer()))
    tables = load_tables(out)
    answers = tables["answers"]
    assert set(answers["condition"]) == {"original", "relay"} and set(answers["selector"]) == {"snapkv", "full"}
    snap = answers[answers.selector == "snapkv"].iloc[0]
    from relaylens.datasets.prompting import render_prompt

    prompt = render_prompt(load_records(data)[0], tiny_tokenizer(), mode="chat")
    n_protected = int(prompt.protected_mask().sum())
    assert snap["mean_count"] == n_protected + (prompt.history_length - n_protected) // 10  # 10% of the source
    table10 = build("table10", tables)
    assert list(table10["setting"]) == ["FullKV", "snapkv 10% original", "snapkv 10% relay"]
    assert (table10["n"] == 2).all() and table10["quality"].between(0, 1).all()
    assert set(build("table11", tables)["category"]) == {items[0]["category"], items[1]["category"]}
    # `relaylens judge RUN_DIR`: a second judge re-scores the same summaries by checklist, answers untouched
    from relaylens.experiments.rejudge import rejudge_run
    from relaylens.reporting.figures.registry import prepare_tables

    before = (out / "answers.parquet").read_bytes()
    result = rejudge_run(out, Scripted(_reply([0.5] * 6)), "second")
    assert result.judged == len(answers) and not result.failures and (out / "answers.parquet").read_bytes() == before
    second = build("table10", prepare_tables(load_tables(out), "quality_second"))
    assert (second["quality"] == 0.5).all() and (second["coverage"] == 0.5).all() and (second["failures"] == 0).all()
    short = Scripted(_reply([0.5] * 6))
    short.max_tokens = 32  # the memory judge's default: too short for a checklist reply
    with pytest.warns(UserWarning, match="--max-tokens 2048"):
        rejudge_run(out, short, "short")
    broken = rejudge_run(out, Scripted("no idea"), "broken")
    assert len(broken.failures) == len(answers)
    failed = build("table10", dict(load_tables(out), metrics=("quality_broken",)))  # every reply failed
    assert (failed["failures"] == 2).all() and (failed["n"] == 0).all() and failed["quality"].isna().all()


