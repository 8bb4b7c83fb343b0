"""learned_geometry end to end on a tiny model: the seeded cluster split, the Adam ascent, the training unit and its
resume, the learned file and ``learned:RUN_DIR`` elsewhere (refused for another model, selector or the train
records), the evaluation tables, and the CLI's option checks."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from relaylens.datasets.records import Record
from relaylens.errors import RelaylensError
from relaylens.experiments.config import RunConfig
from relaylens.experiments.learned import LearnOptions, adam_step, batch_of, split_records
from relaylens.experiments.runner import run_analysis
from relaylens.experiments.specs import load_analysis
from relaylens.results.store import load_tables
from relaylens.results.tables import ANSWER_LOGLIK, SENSITIVITY_METRICS

MODULE = load_analysis("learned_geometry")
OPTIONS = MODULE.OPTIONS.replace(steps=3, batch_records=1, eval_every=2)


def _records(n: int, clusters=None):
    return [Record(f"r{i}", "q", ("a",), "single-session-user", None, (), (), False,
                   cluster_id=None if clusters is None else clusters[i]) for i in range(n)]


def test_split_is_seeded_and_keeps_clusters_whole():
    records = _records(10, clusters=["a", "a", "a", "b", "b", "c", "d", "e", "f", "g"])
    train, test = split_records(records, seed=0, train_fraction=0.5)
    assert split_records(records, seed=0, train_fraction=0.5) == (train, test)
    assert {r.record_id for r in train}.isdisjoint(r.record_id for r in test) and len(train) + len(test) == 10
    for cluster in "ab":
        sides = {("train" if r in train else "test") for r in records if r.cluster_id == cluster}
        assert len(sides) == 1, cluster
    assert any(split_records(records, seed=s, train_fraction=0.5)[0] != train for s in range(1, 6))
    with pytest.raises(RelaylensError, match="record id 'r0' twice"):
        split_records(_records(3) + _records(1), 0, 0.5)
    with pytest.raises(RelaylensError, match="at least 2 records"):
        split_records(_records(1), 0, 0.5)


def test_options_are_validated_and_draws_are_seeded():
    with pytest.raises(RelaylensError, match="sharing must be one of global, layer, head"):
        LearnOptions(sharing="band")
    with pytest.raises(RelaylensError, match="train_fraction"):
        LearnOptions().replace(train_fraction=1.0)
    assert LearnOptions(steps=25, eval_every=10).eval_steps() == [0, 10, 20, 25]
    assert batch_of(3, 10, 4, 0) == batch_of(3, 10, 4, 0) != batch_of(4, 10, 4, 0)
    assert batch_of(0, 3, 8, 0) == [0, 1, 2] == batch_of(0, 3, 0, 0)


def test_adam_ascends_and_keeps_alpha_in_range():
    raw = {"b": torch.zeros(2), "s": torch.zeros(2), "alpha": torch.ones(2)}
    zeros = {k: torch.zeros(2) for k in raw}
    m, v = dict(zeros), dict(zeros)
    adam_step(raw, {"b": torch.tensor([1.0, -1.0]), "s": torch.zeros(2), "alpha": torch.tensor([1.0, -1.0])}, m, v, 1, 0.1)
    assert raw["b"].tolist() == pytest.approx([0.1, -0.1]) and raw["alpha"].tolist() == pytest.approx([1.0, 0.9])


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    from relaylens.datasets.synthetic import generate_records
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("learned")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=6, seed=3, history_tokens=800)))
    return root, data, (tiny_model("llama"), tiny_tokenizer())


def _run(workspace, out, options=OPTIONS, **config):
    root, data, model_and_tokenizer = workspace
    spec = MODULE.SPEC.replace(max_new_tokens=2, budgets=(0.4,))
    config = RunConfig(model="tiny-llama", data=str(data), limit=4, out=str(root / out), window_size=4, **config)
    return MODULE.RUN(spec, config, options, progress=False, model_and_tokenizer=model_and_tokenizer)


@pytest.fixture(scope="module")
def learned_run(workspace):
    return _run(workspace, "learned")


def test_run_trains_saves_and_evaluates(learned_run):
    tables = load_tables(learned_run)
    geometry = tables["geometry"]
    assert set(geometry["record_id"]) == {"training"} and geometry["step"].max() == 3
    assert set(geometry[geometry["metric"] == "test_loglik"]["step"]) == {0, 2, 3}
    assert set(geometry[geometry["metric"] == "train_all_loglik"]["step"]) == {0, 2, 3}
    assert len(geometry[geometry["metric"] == "train_loglik"]) == 3
    layers = sorted(geometry[(geometry["metric"] == "b") & (geometry["step"] == 3)]["layer"])
    assert layers == [0, 1]  # per layer (the default sharing), head -1
    assert set(geometry[geometry["metric"].str.startswith("adam_m:")]["step"]) == {3}  # the latest moments only
    saved = json.loads((learned_run / "learned_geometry.json").read_text())
    assert saved["sharing"] == "layer" and saved["selector"] == "bm25" and len(saved["parameters"]["b"]) == 2
    assert set(saved["train_records"]).isdisjoint(saved["test_records"])
    answers, scores, probes = tables["answers"], tables["scores"], tables["probes"]
    assert set(answers["condition"]) == {"original", "relay", "learned"}
    assert set(answers["record_id"]) == set(saved["test_records"])
    assert set(scores[scores["metric"] == ANSWER_LOGLIK]["condition"]) == {"original", "relay", "learned"}
    assert set(SENSITIVITY_METRICS) <= set(probes["metric"]) and "evidence_share" in set(probes["metric"])
    relay_ll = scores[(scores["metric"] == ANSWER_LOGLIK) & (scores["condition"] == "relay")]["value"].mean()
    assert relay_ll == pytest.approx(geometry[(geometry["metric"] == "test_loglik") & (geometry["step"] == 0)]["value"].item(), abs=1e-4)


def test_training_resumes_at_its_last_step(workspace, learned_run):
    partial = _run(workspace, "resumed", OPTIONS.replace(steps=1))
    resumed = _run(workspace, "resumed", OPTIONS, force=True)  # the same directory, two more steps
    assert resumed == partial
    want, got = load_tables(learned_run)["geometry"], load_tables(resumed)["geometry"]
    for name in ("b", "s", "alpha"):
        a = want[(want["metric"] == name) & (want["step"] == 3)]["value"].to_numpy()
        b = got[(got["metric"] == name) & (got["step"] == 3)]["value"].to_numpy()
        assert a == pytest.approx(b, abs=1e-9), name


def test_learned_condition_runs_elsewhere_and_refuses_mismatches(workspace, learned_run):
    root, data, model_and_tokenizer = workspace
    saved = json.loads((learned_run / "learned_geometry.json").read_text())
    spec = load_analysis("coordinate_ablation").SPEC.replace(
        conditions=("original", f"learned:{learned_run}"), max_new_tokens=2, budgets=(0.4,), probes=False)
    test_ids = saved["test_records"]
    records = [r for r in json.loads(data.read_text()) if r["question_id"] in test_ids]
    test_data = root / "test_records.json"
    test_data.write_text(json.dumps(records))
    config = RunConfig(model="tiny-llama", data=str(test_data), out=str(root / "elsewhere"), window_size=4, limit=4)
    out = run_analysis(spec, config, progress=False, model_and_tokenizer=model_and_tokenizer)
    assert f"learned:{learned_run}" in set(load_tables(out)["answers"]["condition"])
    with pytest.raises(RelaylensError, match="trained on .* a train/test overlap"):
        run_analysis(spec, dataclasses.replace(config, data=str(data), out=str(root / "overlap")), progress=False,
                     model_and_tokenizer=model_and_tokenizer)
    with pytest.raises(RelaylensError, match="learned on bm25 @ 0.4; this run sweeps snapkv @ 0.4"):
        run_analysis(spec.replace(selectors=("snapkv",)), dataclasses.replace(config, out=str(root / "other_sel")),
                     progress=False, model_and_tokenizer=model_and_tokenizer)
    from relaylens.testing import tiny_model

    with pytest.raises(RelaylensError, match="learned on model tiny-llama .*weights_hash"):
        run_analysis(spec, dataclasses.replace(config, out=str(root / "other_model")), progress=False,
                     model_and_tokenizer=(tiny_model("llama", seed=7), model_and_tokenizer[1]))


def test_figures_and_report_of_the_run(learned_run, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from relaylens.reporting import summaries
    from relaylens.reporting.figures import write_figures
    from relaylens.reporting.report import write_report

    monkeypatch.setattr(summaries, "N_RESAMPLES", 300)

    names = sorted(p.name for p in write_figures(learned_run, formats=["png"]))
    assert names == ["learned_geometry.png", "learned_table.csv", "learned_table.md", "positional_sensitivity.png"]
    html = write_report(learned_run).read_text()
    assert 'id="figure-learned_geometry"' in html and "learned_table" in html and "http://" not in html


@pytest.mark.parametrize("argv, message", [
    (["run", "coordinate_ablation", "--steps", "3"], "--steps apply to learned_geometry only"),
    (["sweep", "learned_geometry", "--shards", "2"], "does not run in shards"),
    (["run", "learned_geometry", "--sharing", "band", "--data", "no-such-file.json"], "sharing must be one of"),
])
def test_cli_refuses_misplaced_learning_options(argv, message, tmp_path):
    result = subprocess.run([sys.executable, "-m", "relaylens.cli", *argv], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)
    assert result.returncode == 2 and message in result.stdout + result.stderr, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
