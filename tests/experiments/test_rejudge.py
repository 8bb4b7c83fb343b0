"""``relaylens judge``: re-scoring a finished run leaves generations byte-identical, adds judge_<name> scores, lists
malformed replies as failures; agreement statistics against hand-computed values; evidence retention counts."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from relaylens.errors import RelaylensError
from relaylens.experiments.rejudge import judge_name, rejudge_run
from relaylens.reporting.retention import retained_keys, retention_table
from relaylens.results.store import RunStore, load_tables
from relaylens.scoring.agreement import cohen_kappa, cross_judge_table


def test_cohen_kappa_textbook_table():
    # 50 items: both yes 20, A yes / B no 5, A no / B yes 10, both no 15 -> p_o 0.7, p_e 0.5, kappa 0.4
    a = [1] * 20 + [1] * 5 + [0] * 10 + [0] * 15
    b = [1] * 20 + [0] * 5 + [1] * 10 + [0] * 15
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert cohen_kappa([1, 1], [1, 1]) == 1.0 and math.isnan(cohen_kappa([], []))


class Stub:
    """A judge backend that answers from a table ``candidate -> reply`` (blinded: it sees only the payload)."""

    def __init__(self, replies: dict[str, str], model_id: str):
        self.replies, self.model_id, self.calls = replies, model_id, 0

    def complete(self, system: str, user: str) -> str:
        self.calls += 1
        candidate = json.loads(user.split("\n\n", 1)[1])["candidate"]
        return self.replies.get(candidate, '{"correct": false}')


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("rejudge")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=3, seed=4, history_tokens=800)))
    spec = load_analysis("main_table").spec.replace(selectors=("snapkv", "bm25"), budgets=(0.4,), max_new_tokens=3)
    out = root / "run"
    run_analysis(spec, RunConfig(data=str(data), out=str(out)), progress=False,
                 model_and_tokenizer=(tiny_model("llama", seed=0, initializer_range=0.2), tiny_tokenizer()))
    return out


def test_rejudge_changes_only_judge_scores(finished_run):
    before = {n: (finished_run / f"{n}.parquet").read_bytes() for n in ("answers", "probes")}
    store = RunStore.open(finished_run)
    machines = {path.name: store.unit_machine(path) for path in store.unit_paths()}
    assert all(m and m["device"] == "cpu" for m in machines.values()), machines  # the run stamped every unit
    tables = load_tables(finished_run)
    answers = tables["answers"]
    relay = set(answers[answers.condition == "relay"].answer) - set(answers[answers.condition == "original"].answer)
    assert relay, ("a tiny model with larger weights answers differently under relay (needed for a judge that "
                   "favours relay)")
    malformed = sorted(relay)[0]
    replies = {text: '{"correct": true}' for text in relay} | {malformed: "Sure! It is correct."}
    result = rejudge_run(finished_run, Stub(replies, "stub-a"), "stub_a")
    assert {n: (finished_run / f"{n}.parquet").read_bytes() for n in ("answers", "probes")} == before
    after = load_tables(finished_run)["scores"]
    untouched = after[~after.metric.str.startswith("judge_stub_a")].reset_index(drop=True)
    pd.testing.assert_frame_equal(untouched, tables["scores"].reset_index(drop=True))
    judged = after[after.metric == "judge_stub_a"]
    assert len(judged) == len(answers) == result.judged
    failed_rows = answers[answers.answer == malformed]
    assert len(result.failures) == len(failed_rows) > 0
    assert {f["reply"] for f in result.failures} == {"Sure! It is correct."}
    listed = json.loads((finished_run / "judge_stub_a_failures.json").read_text())
    assert len(listed) == len(result.failures)
    flags = after[after.metric == "judge_stub_a_failed"].set_index(["record_id", "selector", "condition"]).value
    assert flags.sum() == len(failed_rows)
    assert judged.value.isna().sum() == len(failed_rows), "a malformed reply never counts as correct"
    assert json.loads((finished_run / "judges.json").read_text())["stub_a"]["failures"] == len(failed_rows)
    # a second pass reuses the cache: no backend calls, same rows
    stub = Stub(replies, "stub-a")
    rejudge_run(finished_run, stub, "stub_a")
    assert stub.calls == 0
    pd.testing.assert_frame_equal(load_tables(finished_run)["scores"], after)
    # the judge pass rewrote every unit and kept the stamp of the machine that computed its answers
    assert {path.name: store.unit_machine(path) for path in store.unit_paths()} == machines


def test_rejudge_reports_each_unit_file_once_in_order(finished_run):
    seen = []
    rejudge_run(finished_run, Stub({}, "stub-p"), "stub_p", progress=lambda done, total: seen.append((done, total)))
    units = len(RunStore.open(finished_run).unit_paths())
    assert units == 6 and seen == [(done, units) for done in range(1, units + 1)]


def test_cross_judge_table_agreement_and_kappa(finished_run):
    answers = load_tables(finished_run)["answers"]
    texts = sorted(set(answers.answer))
    rejudge_run(finished_run, Stub({t: '{"correct": true}' for t in texts[::2]}, "stub-b"), "stub_b")
    rejudge_run(finished_run, Stub({t: '{"correct": true}' for t in texts[::3]}, "stub-c"), "stub_c")
    scores = load_tables(finished_run)["scores"]
    table = cross_judge_table(scores)
    row = table[(table.selector == "snapkv") & (table.judge_a == "judge_stub_b") & (table.judge_b == "judge_stub_c")]
    assert len(row) == 1
    # independent computation from the answers: verdicts are functions of the answer text
    sub = answers[answers.selector == "snapkv"]
    b = [1.0 if t in texts[::2] else 0.0 for t in sub.answer]
    c = [1.0 if t in texts[::3] else 0.0 for t in sub.answer]
    agree = sum(x == y for x, y in zip(b, c)) / len(b)
    pb, pc = sum(b) / len(b), sum(c) / len(c)
    pe = pb * pc + (1 - pb) * (1 - pc)
    assert row.agreement.iloc[0] == pytest.approx(agree) and row.n.iloc[0] == len(b)
    assert row.kappa.iloc[0] == pytest.approx((agree - pe) / (1 - pe) if pe < 1 else 1.0)
    wide = sub.assign(v=b).pivot(index="record_id", columns="condition", values="v")
    assert row.gain_a.iloc[0] == pytest.approx(float((wide.relay - wide.original).mean()))


def test_bad_judge_names_and_moved_data(finished_run, tmp_path):
    assert judge_name("openai/gpt-oss-20b") == "gpt_oss_20b"
    with pytest.raises(RelaylensError, match="judge name"):
        rejudge_run(finished_run, Stub({}, "x"), "Bad-Name")
    other = tmp_path / "other.json"
    other.write_text("[]")
    with pytest.raises(RelaylensError, match="not the dataset the run used"):
        rejudge_run(finished_run, Stub({}, "x"), "x", data=other)


def test_retention_counts_units_not_conditions():
    answers = pd.DataFrame({
        "record_id": ["a", "a", "b", "b", "c", "a"], "selector": ["bm25"] * 5 + ["snapkv"],
        "budget": [0.1] * 6, "condition": ["original", "relay"] * 3,
        "gold_units_total": [2, 2, 1, 1, 0, 2], "gold_units_kept": [2, 2, 0, 0, 0, 1]})
    table = retention_table(answers).set_index("selector")
    assert (table.loc["bm25", "records"], table.loc["bm25", "retained"]) == (2, 1)  # c has no gold: not counted
    assert (table.loc["snapkv", "records"], table.loc["snapkv", "retained"]) == (1, 0)  # partial: not retained
    assert retained_keys(answers) == {("a", "bm25", 0.1)}


class Killed(BaseException):
    """Stands for SIGKILL: nothing in relaylens catches it."""


def test_a_killed_judge_pass_is_not_published_until_resumed(finished_run):
    """`relaylens judge` killed after rewriting some units: the next consolidation (a resumed run, a merge) must not
    show judge_NAME over those units only; judges.json names the pass as interrupted; re-running it completes it."""
    from relaylens.reporting.report import write_report
    from relaylens.results.store import RunStore

    class Dies(Stub):
        def complete(self, system, user):
            if self.calls == 3:
                raise Killed
            return super().complete(system, user)

    answers = load_tables(finished_run)["answers"]
    with pytest.raises(Killed):
        rejudge_run(finished_run, Dies({}, "stub-k"), "stub_k")
    RunStore.open(finished_run).consolidate()  # what a resumed run or a merge does next
    assert not load_tables(finished_run)["scores"].metric.str.startswith("judge_stub_k").any()
    from relaylens.results.store import load_run

    tables, hidden = load_run(finished_run)
    assert "stub_k" in hidden and "interrupted" in hidden["stub_k"] and "relaylens judge" in hidden["stub_k"]
    assert json.loads((finished_run / "judges.json").read_text())["stub_k"]["status"] == "incomplete"
    with pytest.warns(UserWarning, match="judge pass stub_k was interrupted"):
        html = write_report(finished_run, out=finished_run / "killed.html").read_text()
    assert "judge pass stub_k was interrupted" in html
    stub = Stub({}, "stub-k")
    rejudge_run(finished_run, stub, "stub_k")  # the same command again: resumes from the cached verdicts
    assert stub.calls <= len(answers) - 2, "the two verdicts given before the kill are cached"
    tables, hidden = load_run(finished_run)
    assert (tables["scores"].metric == "judge_stub_k").sum() == len(answers) and "stub_k" not in hidden


class OfficialStub:
    """A LongMemEval-template backend: records each (system, prompt) and answers "Yes" for the answers in ``yes``."""

    def __init__(self, yes: set[str], model_id: str):
        self.yes, self.model_id, self.calls = yes, model_id, []

    def complete(self, system: str, user: str) -> str:
        self.calls.append((system, user))
        response = user.split("\n\nModel Response: ", 1)[1].rsplit("\n\n", 1)[0]
        return "Yes." if response in self.yes else "No."


def test_longmemeval_template_adds_its_own_scores_beside_the_others(finished_run):
    from relaylens.reporting.figures import build
    from relaylens.reporting.figures.registry import prepare_tables

    before = {n: (finished_run / f"{n}.parquet").read_bytes() for n in ("answers", "probes")}
    tables = load_tables(finished_run)
    answers = tables["answers"]
    yes = set(sorted(set(answers.answer))[::2])
    stub = OfficialStub(yes, "stub-l")
    result = rejudge_run(finished_run, stub, "stub_l", template="longmemeval")
    assert result.metrics == ["judge_lme_stub_l", "judge_lme_stub_l_failed"] and not result.failures
    assert stub.calls and {system for system, _ in stub.calls} == {""}  # one user message, as the benchmark
    assert {n: (finished_run / f"{n}.parquet").read_bytes() for n in ("answers", "probes")} == before
    scores = load_tables(finished_run)["scores"]
    untouched = scores[~scores.metric.str.startswith("judge_lme_stub_l")].reset_index(drop=True)
    pd.testing.assert_frame_equal(untouched, tables["scores"].reset_index(drop=True))
    key = ["record_id", "selector", "condition"]
    judged = scores[scores.metric == "judge_lme_stub_l"].set_index(key).value.sort_index()
    expected = answers.assign(v=answers.answer.isin(yes).astype(float)).set_index(key).v.sort_index()
    pd.testing.assert_series_equal(judged, expected, check_names=False)
    entry = json.loads((finished_run / "judges.json").read_text())["lme_stub_l"]
    assert entry["template"] == "longmemeval" and entry["metric"] == "judge_lme_stub_l"
    assert (finished_run / "judge_cache_lme_stub_l.jsonl").is_file()
    again = OfficialStub(yes, "stub-l")
    rejudge_run(finished_run, again, "stub_l", template="longmemeval")
    assert not again.calls  # cached
    table = build("longmemeval_metrics", prepare_tables(load_tables(finished_run)))
    overall = table.set_index(["selector", "condition"]).overall.sort_index()
    means = expected.groupby(level=["selector", "condition"]).mean().sort_index()
    pd.testing.assert_series_equal(overall, means, check_names=False)
    with pytest.raises(RelaylensError, match="reserved for --judge-template longmemeval"):
        rejudge_run(finished_run, Stub({}, "x"), "lme_x")


def test_longmemeval_template_inline_in_a_run(tmp_path, monkeypatch):
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments import run_setup
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis
    from relaylens.scoring.longmemeval_judge import LongMemEvalJudge
    from relaylens.testing import tiny_model, tiny_tokenizer

    data = tmp_path / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=5, history_tokens=900)))
    stub = OfficialStub(set(), "stub-inline")
    monkeypatch.setattr(run_setup, "make_judge",
                        lambda config, out, records=None: LongMemEvalJudge(stub, out / "judge_cache_lme.jsonl"))
    spec = load_analysis("main_table").spec.replace(selectors=("bm25",), budgets=(0.4,), max_new_tokens=2)
    out = tmp_path / "run"
    run_analysis(spec, RunConfig(data=str(data), out=str(out), judge_model="stub-inline", judge_template="longmemeval"),
                 progress=False, model_and_tokenizer=(tiny_model("llama", seed=0), tiny_tokenizer()))
    scores = load_tables(out)["scores"]
    assert (scores.metric == "judge_lme").sum() == len(load_tables(out)["answers"]) > 0
    assert (scores[scores.metric == "judge_lme"].value == 0.0).all() and "judge" not in set(scores.metric)
    assert json.loads((out / "manifest.json").read_text())["config"]["run"]["judge_template"] == "longmemeval"
