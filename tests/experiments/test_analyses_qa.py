"""The InfiniteBench (Table 2) and FINCH comparison (Table 7) analyses end to end on a tiny model, in process."""

from __future__ import annotations

import json

import pytest

from relaylens.experiments.runner import RunConfig, run_analysis
from relaylens.experiments.specs import load_analysis
from relaylens.results.store import load_tables


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from relaylens.testing import tiny_model, tiny_tokenizer

    return tiny_model("llama", seed=0), tiny_tokenizer()


def test_infinitebench_runs_on_its_bundled_sample(tmp_path, model_and_tokenizer):
    spec = load_analysis("infinitebench").spec.replace(max_new_tokens=3)
    assert spec.data == "sample:infinitebench" and spec.selectors == ("snapkv",) and spec.budgets == (0.01,)
    out = run_analysis(spec, RunConfig(out=str(tmp_path / "ib"), limit=3), progress=False,
                       model_and_tokenizer=model_and_tokenizer)
    tables = load_tables(out)
    answers, scores = tables["answers"], tables["scores"]
    assert sorted(answers["question_type"].unique()) == ["longbook_choice_eng", "longbook_qa_eng",
                                                         "longdialogue_qa_eng"]
    assert set(answers["condition"]) == {"original", "relay"}
    choice = scores[(scores.question_type == "longbook_choice_eng") & (scores.metric == "choice_accuracy")]
    assert len(choice) == 2  # multiple-choice accuracy is scored for both conditions
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["spec"]["data"] == "sample:infinitebench"
    assert manifest["dataset"]["path"].endswith("sample_infinitebench.jsonl")


def test_finch_comparison_runs_with_finch_coordinates(tmp_path, model_and_tokenizer):
    from relaylens.datasets.synthetic import generate_records

    data = tmp_path / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=3, history_tokens=600)))
    spec = load_analysis("finch_comparison").spec.replace(max_new_tokens=4, budgets=(0.3,))  # whole BM25 sessions fit
    out = run_analysis(spec, RunConfig(out=str(tmp_path / "fc"), data=str(data), limit=2), progress=False,
                       model_and_tokenizer=model_and_tokenizer)
    answers = load_tables(out)["answers"]
    assert set(answers["selector"]) == {"finch", "bm25", "pyramidkv", "chunkkv"}
    finch = answers[answers.selector == "finch"].set_index(["record_id", "condition"])
    for rid in finch.index.get_level_values(0).unique():
        # FINCH keeps K states in every head, so its compact coordinates (rank_sync) are relay's: same answers
        assert finch.loc[(rid, "rank_sync"), "answer"] == finch.loc[(rid, "relay"), "answer"]
        assert finch.loc[(rid, "rank_sync"), "question_start"] == finch.loc[(rid, "rank_sync"), "max_count"]
        assert finch.loc[(rid, "original"), "question_start"] == finch.loc[(rid, "original"), "history_length"]


def test_infinitebench_length_filter_skips_and_lists(tmp_path, model_and_tokenizer):
    """Records over --max-history-tokens are skipped (listed in the skipped table), the others run."""
    from relaylens.datasets import load_records
    from relaylens.datasets.prompting import render_prompt
    from relaylens.datasets.synthetic_infinitebench import bundled_infinitebench_path

    _, tokenizer = model_and_tokenizer
    spec = load_analysis("infinitebench").spec.replace(max_new_tokens=2)
    lengths = {r.record_id: render_prompt(r, tokenizer, mode=spec.prompt_mode).history_length
               for r in load_records(bundled_infinitebench_path())[:3]}
    cut = sorted(lengths.values())[1]  # the shortest two fit, the longest does not
    out = run_analysis(spec, RunConfig(out=str(tmp_path / "ib"), limit=3, max_history_tokens=cut), progress=False,
                       model_and_tokenizer=model_and_tokenizer)
    tables = load_tables(out)
    too_long = {rid for rid, n in lengths.items() if n > cut}
    assert set(tables["skipped"]["record_id"]) == too_long and set(tables["skipped"]["reason"]) == {"too_long"}
    assert set(tables["answers"]["record_id"]) == set(lengths) - too_long
