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

ANALYSIS = load_analysis("learned_geometry")
OPTIONS = ANALYSIS.options.replace(steps=3, batch_records=1, eval_every=2)


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
    adam_step(raw, {"b": torch.tensor([1.0, -1.0]), "s": torch.zeros(2), "alpha": torch.tensor([1.0, -1.0])}, m, v, 1,
              0.1)
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
    spec = ANALYSIS.spec.replace(max_new_tokens=2, budgets=(0.4,))
    config = RunConfig(model="tiny-llama", data=str(data), limit=4, out=str(root / out), window_size=4, **config)
    return ANALYSIS.run(spec, config, options, progress=False, model_and_tokenizer=model_and_tokenizer)


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
    at_start = geometry[(geometry["metric"] == "test_loglik") & (geometry["step"] == 0)]["value"].item()
    assert relay_ll == pytest.approx(at_start, abs=1e-4)


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
    spec = load_analysis("coordinate_ablation").spec.replace(
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


# ------------------------------------------------------------------------- issue 41: items 5, 6, 7, 12, 14, 16

def _test_data(workspace, learned_dir, name="test_records.json"):
    """The learned run's test records as a data file of their own (``learned:`` refuses its train records)."""
    root, data, _ = workspace
    saved = json.loads((learned_dir / "learned_geometry.json").read_text())
    records = [r for r in json.loads(data.read_text()) if r["question_id"] in saved["test_records"]]
    path = root / name
    path.write_text(json.dumps(records))
    return path


def _copy_learned(learned_run, target):
    """A run directory holding a copy of the learned file and manifest (edited by the test, not by others)."""
    import shutil

    target.mkdir(exist_ok=True)
    for name in ("learned_geometry.json", "manifest.json"):
        shutil.copy(learned_run / name, target / name)
    return target


def _elsewhere(workspace, learned_dir, out, spec_changes=None, **config):
    root, data, model_and_tokenizer = workspace
    spec = load_analysis("coordinate_ablation").spec.replace(
        **{"conditions": ("original", f"learned:{learned_dir}"), "max_new_tokens": 2, "budgets": (0.4,),
           "probes": False, **(spec_changes or {})})
    config = RunConfig(**{"model": "tiny-llama", "data": str(_test_data(workspace, learned_dir)),
                          "out": str(root / out),
                          "window_size": 4, "limit": 4, **config})
    return run_analysis(spec, config, progress=False, model_and_tokenizer=model_and_tokenizer)


def _scale_b(learned_dir, factor):
    path = learned_dir / "learned_geometry.json"
    doc = json.loads(path.read_text())
    doc["parameters"]["b"] = [b * factor for b in doc["parameters"]["b"]]
    path.write_text(json.dumps(doc))


def test_learned_geometry_is_pinned_by_content(workspace, learned_run, tmp_path):
    """Item 5: the manifest records the learned file's hash and parameters; every record uses those (the parsed
    condition, not the file); a changed file under the same label is refused on resume (with --force too) and merge."""
    from relaylens.conditions.scoped import get_condition
    from relaylens.experiments.learned import check_learned_conditions
    from relaylens.geometry.selection import Selection
    from relaylens.results.shards import merge_runs
    from relaylens.results.store import ResultStoreError, RunStore

    geo = _copy_learned(learned_run, tmp_path / "geo")
    label = f"learned:{geo}"
    out = _elsewhere(workspace, geo, tmp_path / "first", limit=1)
    pinned = RunStore.open(out).manifest["config"]["learned"][label]
    saved = json.loads((geo / "learned_geometry.json").read_text())
    assert pinned["parameters"] == saved["parameters"] and len(pinned["sha256"]) == 64
    # the spec the runner uses holds the parsed condition: a later edit of the file changes no record
    spec = load_analysis("coordinate_ablation").spec.replace(conditions=("original", label), budgets=(0.4,))
    manifest = {"model": RunStore.open(out).manifest["model"], "config": {"run": {"window_mode": "condition"}}}
    spec = spec.replace(prompt_mode=saved["prompt_mode"])
    pinned_spec = check_learned_conditions(spec, manifest, [])
    sel = Selection.from_lists([[[2, 5, 6, 11], [0, 9, 18, 19]]] * 2, history_length=20)
    before = get_condition(pinned_spec.conditions[1]).coordinates(sel).key_positions
    _scale_b(geo, 2.0)
    assert torch.equal(get_condition(pinned_spec.conditions[1]).coordinates(sel).key_positions, before)
    with pytest.raises(ResultStoreError, match="another learned geometry"):  # resume, same settings
        _elsewhere(workspace, geo, tmp_path / "first", limit=1)
    with pytest.raises(ResultStoreError, match="not even --force continues"):  # more records, --force: never a mix
        _elsewhere(workspace, geo, tmp_path / "first", limit=2, force=True)
    # merge: two shards that read two different files under one label
    _scale_b(geo, 0.5)
    shard0 = _elsewhere(workspace, geo, tmp_path / "s0", shard="0/2")
    _scale_b(geo, 3.0)
    shard1 = _elsewhere(workspace, geo, tmp_path / "s1", shard="1/2")
    with pytest.raises(RelaylensError, match="config.learned"):
        merge_runs([shard0, shard1], tmp_path / "merged")


@pytest.mark.parametrize("changes, config, named", [
    ({"protect_instructions": not ANALYSIS.spec.protect_instructions}, {}, "protect_instructions"),
    ({"granularity": "session"}, {}, "granularity"),
    ({"selector_options": {"bm25": {"b": 0.5}}}, {}, "selector_options"),
    ({"prompt_mode": "completion"}, {}, "prompt_mode"),  # the fit ran chat prompts (the tokenizer's template)
    ({}, {"window_mode": "none"}, "window_mode"),
    ({"budgets": (0.3,)}, {}, "learned on bm25 @ 0.4; this run sweeps bm25 @ 0.3"),
])
def test_learned_condition_checks_every_fit_setting(workspace, learned_run, tmp_path, changes, config, named):
    """Item 7: selector options, budget, protected framing, prompt mode, granularity, window mode (and the model,
    test_learned_condition_runs_elsewhere_and_refuses_mismatches) must match the fit, or the run is refused naming
    it."""
    with pytest.raises(RelaylensError, match=named) as caught:
        _elsewhere(workspace, learned_run, tmp_path / "mismatch", changes, **config)
    assert "\n" not in str(caught.value)


def test_force_with_another_seed_never_evaluates_training_records(workspace, tmp_path):
    """Item 6: --force with another seed (another split) retrains; no record of the new fit's train split is
    evaluated, and the tables hold exactly the new test split."""
    root, data, _ = workspace
    records = split_records_of(data)
    first = _run(workspace, tmp_path / "forced", seed=0)
    train_ids = [{r.record_id for r in split_records(records, s, 0.5)[0]} for s in range(50)]
    seed = next(s for s in range(1, 50) if train_ids[s] != train_ids[0])  # another split, not just another order
    forced = _run(workspace, tmp_path / "forced", seed=seed, force=True)
    assert forced == first
    train, test = ({r.record_id for r in side} for side in split_records(records, seed, 0.5))
    saved = json.loads((forced / "learned_geometry.json").read_text())
    assert set(saved["train_records"]) == train and set(saved["test_records"]) == test
    tables = load_tables(forced)
    evaluated = set(tables["answers"]["record_id"]) | set(tables["scores"]["record_id"])
    assert evaluated == test and not evaluated & train
    assert (tables["geometry"]["step"] == 0).any()  # trained again from RoPERelay


def split_records_of(data):
    from relaylens.datasets import load_records

    return load_records(data)[:4]


def test_diverged_training_is_not_resumed_from(workspace, tmp_path):
    """Item 14: a step whose parameters overflow is refused before it is committed, and the advice (a lower
    learning rate, --force) trains again from RoPERelay and finishes."""
    from relaylens.errors import NonFiniteError
    from relaylens.results.store import RunStore, UnitKey

    with pytest.raises(NonFiniteError, match=r"diverged at step 1 .*lower --learning-rate"):
        _run(workspace, tmp_path / "diverged", OPTIONS.replace(learning_rate=1000.0, steps=2))
    store = RunStore.open(tmp_path / "diverged")
    geometry = store.read_unit(store.unit_path(UnitKey("training", "bm25", 0.4)))["geometry"]
    assert set(geometry["step"]) == {0}  # only the starting point is committed
    out = _run(workspace, tmp_path / "diverged", OPTIONS.replace(steps=2), force=True)
    saved = json.loads((out / "learned_geometry.json").read_text())
    values = [v for name in ("b", "s", "alpha") for v in saved["parameters"][name]]
    assert all(abs(v) < 100 for v in values) and saved["options"]["learning_rate"] == 0.05


@pytest.mark.parametrize("clusters, fraction, size", [
    ("aaaaaaab", 0.5, 1),           # 7 + 1: either side of 4 is 3 away; never every record in train
    ("abbbbbcdef", 0.5, 5),         # 5 reachable exactly (the big cluster, or five singletons)
    ("aabbccddee", 0.3, 2),         # pairs only: 2 and 4 are as near as 3 allows; the smaller wins
    ("abcdefgh", 0.25, 2),          # singletons: the fraction itself
])
def test_split_honours_its_fraction_for_every_seed(clusters, fraction, size):
    """Item 16: whole clusters whose sizes add up nearest the fraction, for every seed; test is never empty."""
    records = _records(len(clusters), clusters=list(clusters))
    for seed in range(25):
        train, test = split_records(records, seed=seed, train_fraction=fraction)
        assert len(train) == size and test, (seed, len(train))
        for cluster in set(clusters):
            assert len({r in train for r in records if r.cluster_id == cluster}) == 1
    with pytest.raises(RelaylensError, match="one cluster"):
        split_records(_records(3, clusters=["x"] * 3), 0, 0.5)


def test_conditions_the_learned_run_would_ignore_are_refused(workspace, tmp_path):
    """Item 11: learned_geometry evaluates original, relay and its own map; a --condition (scoped or not) it would
    silently drop is refused before the model loads, naming it."""
    root, data, model_and_tokenizer = workspace
    spec = ANALYSIS.spec.replace(conditions=("original", "relay@heads=0.0@move=1@base=relay"), budgets=(0.4,))
    config = RunConfig(model="tiny-llama", data=str(data), limit=4, out=str(tmp_path / "ignored"), window_size=4)
    with pytest.raises(RelaylensError, match=r"does not run relay@heads=0.0@move=1@base=relay\. Fix: drop --condition"):
        ANALYSIS.run(spec, config, OPTIONS, progress=False, model_and_tokenizer=model_and_tokenizer)
    assert not (tmp_path / "ignored").exists()
