"""``kvpress:<Press>`` selectors in relaylens's own environment: names, arguments, budgets, refusals, bad presses,
the pass's hygiene, and ``relaylens run main_table --selector kvpress:...`` end to end on a tiny saved model.

The equality with kvpress's own pipeline is ``test_kvpress_adapter_equality.py``. Tests that need kvpress are skipped
locally without it and FAIL under ``CI=true`` (``make test`` installs it with ``--no-deps``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from relaylens.errors import RelaylensError, TooShortError
from relaylens.experiments.specs import ExperimentSpec, apply_overrides, parse_selector_arg
from relaylens.selectors import KvPress, PressError, is_selector_name, make_selector
from relaylens.selectors.kvpress_adapter import REFUSED, SCORERS, canonical_name, import_kvpress, known_presses


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.fixture(scope="module")
def kvpress():
    try:
        return import_kvpress()
    except PressError as err:
        if _in_ci():
            pytest.fail(f"CI=true requires kvpress in relaylens's environment: {err}", pytrace=False)
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def record():
    """A tiny random Llama and the prefill of a 120-token history."""
    from relaylens.model.prefill import prefill_history
    from relaylens.testing import peaked_model

    model = peaked_model(num_hidden_layers=2)
    ids = torch.randint(3, 384, (120,), generator=torch.Generator().manual_seed(1))
    return model, prefill_history(model, ids, window_size=8)


# ------------------------------------------------------------------------------------------ names (no kvpress needed)
def test_names_parse_with_the_press_spelling_and_every_place_accepts_them():
    assert parse_selector_arg("kvpress:snapkvpress:window_size=64,kernel_size=3") == \
        ("kvpress:SnapKVPress", {"window_size": 64, "kernel_size": 3})
    assert parse_selector_arg("KVPRESS:CriticalKVPress:press=SnapKVPress,press.window_size=16") == \
        ("kvpress:CriticalKVPress", {"press": "SnapKVPress", "press.window_size": 16})
    assert parse_selector_arg("snapkv:window=8") == ("snapkv", {"window": 8})  # the other selectors unchanged
    assert canonical_name("kvpress:tovapress") == "kvpress:TOVAPress"
    assert is_selector_name("kvpress:KnormPress") and not is_selector_name("knorm")
    assert set(SCORERS).isdisjoint(REFUSED) and len(known_presses()) == len(SCORERS) + len(REFUSED)


def test_kvpress_not_installed_names_the_press_and_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "kvpress", None)  # `import kvpress` raises ImportError
    fix = r"pip install --no-deps kvpress==0\.5\.5"
    with pytest.raises(PressError, match=rf"kvpress:KnormPress needs the kvpress package.*{fix}"):
        make_selector("kvpress:KnormPress")


# ------------------------------------------------------------------------------------------------ with kvpress
def test_the_catalogue_covers_every_press_kvpress_exports(kvpress):
    exported = {n for n in kvpress.__all__ if isinstance(getattr(kvpress, n), type)
                and issubclass(getattr(kvpress, n), kvpress.BasePress)}
    assert exported == set(known_presses()), exported ^ set(known_presses())
    for name in SCORERS:  # every listed scorer builds (wrappers with an inner press)
        extra = {"press": "KnormPress"} if name == "CriticalKVPress" else {}
        assert isinstance(make_selector(f"kvpress:{name}", **extra), KvPress)


@pytest.mark.parametrize("press, reason", [("ThinKPress", "key channels"), ("QFilterPress", "Hugging Face Hub"),
                                           ("KeyRerotationPress", "rank_sync"), ("FinchPress", "query-aware"),
                                           ("DecodingPress", "during decoding"), ("AdaKVPress", "'adakv'"),
                                           ("ScorerPress", "abstract")])
def test_refused_presses_say_why(kvpress, press, reason):
    with pytest.raises(PressError, match=rf"kvpress:{press} cannot be a relaylens selector: it .*{reason}"):
        make_selector(f"kvpress:{press}")


@pytest.mark.parametrize("name, options, message", [
    ("kvpress:SnapKvPres", {}, r"unknown kvpress press 'SnapKvPres'.*did you mean SnapKVPress"),
    ("kvpress:", {}, r"names no press"),
    ("kvpress:KVPressTextGenerationPipeline", {}, r"unknown kvpress press"),
    ("kvpress:SnapKVPress", {"window_sise": 8}, r"no argument 'window_sise' \(did you mean window_size\?\)"),
    ("kvpress:SnapKVPress", {"window_size": "abc"}, r"window_size='abc' is not int"),
    ("kvpress:SnapKVPress", {"window_size": 8.5}, r"window_size=8\.5 is not int"),
    ("kvpress:ExpectedAttentionPress", {"use_covariance": 1}, r"use_covariance=1 is not bool"),
    ("kvpress:CURPress", {"leverage_type": "keys"}, r"leverage_type='keys' is not 'key' \| 'value'"),
    ("kvpress:KnormPress", {"compression_ratio": 0.5}, r"compression_ratio is set by the budget"),
    ("kvpress:CriticalKVPress", {}, r"wraps a scorer press: name it.*press=SnapKVPress"),
    ("kvpress:CriticalKVPress", {"press": "ThinKPress"}, r"kvpress:ThinKPress cannot be a relaylens selector"),
    ("kvpress:KnormPress", {"press.window_size": 3}, r"wraps no press"),
    ("kvpress:RandomPress", {"seed": "x"}, r"seed must be an int"),
])
def test_bad_press_input_is_one_clear_error(kvpress, name, options, message):
    with pytest.raises(PressError, match=message):
        make_selector(name, **options)


def test_specs_accept_presses_and_reject_bad_ones_when_built(kvpress):
    spec = ExperimentSpec("demo", selectors=("snapkv",), budgets=(0.1,), conditions=("original", "relay"))
    s = apply_overrides(spec, selectors=["kvpress:KnormPress", "kvpress:snapkvpress:window_size=16"])
    assert s.selectors == ("kvpress:KnormPress", "kvpress:SnapKVPress")
    assert s.selector_options == {"kvpress:SnapKVPress": {"window_size": 16}}
    with pytest.raises(PressError, match="no argument 'windw'"):
        apply_overrides(spec, selectors=["kvpress:SnapKVPress:windw=3"])
    with pytest.raises(RelaylensError, match="unknown selector 'nope'.*kvpress:<PressName>"):
        ExperimentSpec("demo", selectors=("nope",), budgets=(0.1,), conditions=("original",))


def test_budget_follows_kvpress_compression_ratio_semantics():
    press = KvPress("KnormPress")
    assert press.compression(0.1, 1000) == (0.9, 99)  # int(1000 * (1 - 0.9)) = 99 in floating point
    assert press.compression(0.25, 96) == (0.75, 24)
    ratio, kept = press.compression(37, 424)  # an absolute budget keeps exactly B
    assert kept == 37 and int(424 * (1 - ratio)) == 37 and 0 < ratio < 1
    assert press.compression(1.0, 50) == (0.0, 50) and press.compression(500, 50) == (0.0, 50)


def test_selection_is_sorted_per_head_and_matches_the_press_topk(kvpress, record):
    model, prefill = record
    sel = make_selector("kvpress:KnormPress").prepare(model, prefill).select(prefill, None, 0.25)
    assert sel.counts.tolist() == [[30, 30], [30, 30]] and sel.info["compression_ratio"] == 0.75
    for l in range(2):
        norms = prefill.keys[l].float().norm(dim=-1)  # [kv_head, L]; Knorm keeps the smallest key norms
        for h in range(2):
            kept = sel.layer_positions(l)[h]
            assert torch.equal(kept, kept.sort().values)
            assert set(kept.tolist()) == set(norms[h].topk(30, largest=False).indices.tolist())
    pyramid = make_selector("kvpress:PyramidKVPress", window_size=2, beta=2).prepare(model, prefill)
    counts = pyramid.select(prefill, None, 0.25).counts  # per-layer budgets, shared by the heads of a layer
    assert counts[0, 0] > counts[1, 0] and (counts[:, 0] == counts[:, 1]).all()
    keep_all = make_selector("kvpress:KnormPress").select(prefill, None, 1.0)  # ratio 0: kvpress keeps the cache
    assert keep_all.counts.unique().tolist() == [120]


def test_the_pass_leaves_the_model_and_transformers_as_they_were(kvpress, record):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from relaylens.model.hf import attention_modules

    model, prefill = record
    assert "kvpress" not in getattr(ALL_ATTENTION_FUNCTIONS["sdpa"], "__qualname__", "")  # the import patch undone
    before = torch.random.get_rng_state()
    make_selector("kvpress:ExpectedAttentionPress", seed=3).prepare(model, prefill).select(prefill, None, 0.25)
    assert all(not hasattr(m, "rotary_emb") for m in attention_modules(model))  # kvpress's attribute removed again
    assert torch.equal(torch.random.get_rng_state(), before)  # the seed is scoped to the pass
    a = make_selector("kvpress:LeverageScorePress", seed=3).prepare(model, prefill).select(prefill, None, 0.25)
    b = make_selector("kvpress:LeverageScorePress", seed=3).prepare(model, prefill).select(prefill, None, 0.25)
    assert torch.equal(a.positions, b.positions)  # the random sketch is reproducible through the seed


def test_select_needs_prepare_and_short_histories_are_too_short(kvpress, record):
    model, prefill = record
    with pytest.raises(PressError, match="prepare"):
        make_selector("kvpress:KnormPress").select(prefill, None, 0.25)
    with pytest.raises(TooShortError, match="window_size=200"):  # the runner records the unit as too_short
        make_selector("kvpress:SnapKVPress", window_size=200).prepare(model, prefill).select(prefill, None, 0.5)


def test_a_press_with_bad_scores_is_named(kvpress, record, monkeypatch):
    model, prefill = record

    @dataclass
    class WrongShapePress(kvpress.ScorerPress):
        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            return keys.norm(dim=-1)[:, :1]  # one head only

    @dataclass
    class NanPress(kvpress.ScorerPress):
        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            scores = keys.norm(dim=-1)
            scores[..., 5] = float("nan")
            return scores

    monkeypatch.setattr(kvpress, "WrongShapePress", WrongShapePress, raising=False)
    monkeypatch.setattr(kvpress, "NanPress", NanPress, raising=False)
    with pytest.raises(PressError, match=r"kvpress:WrongShapePress returned scores of shape \(1, 1, 120\) at layer 0; "
                                         r"expected \(1, 2, 120\)"):
        make_selector("kvpress:WrongShapePress").prepare(model, prefill).select(prefill, None, 0.25)
    with pytest.raises(PressError, match=r"kvpress:NanPress returned 2 non-finite scores .* at layer 0"):
        make_selector("kvpress:NanPress").prepare(model, prefill).select(prefill, None, 0.25)


def test_main_table_runs_over_presses_end_to_end(kvpress, tmp_path):
    """``relaylens run main_table --selector kvpress:...`` (several) on a tiny saved model: every press gets original
    and relay rows, and Table 1 builds from the run."""
    from relaylens.datasets.synthetic import generate_records
    from relaylens.results.store import load_tables
    from relaylens.testing import tiny_model, tiny_tokenizer

    model_dir = tmp_path / "tiny"
    tiny_model("llama", seed=0).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    data = tmp_path / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=3, history_tokens=600)))
    out = tmp_path / "run"
    command = [sys.executable, "-m", "relaylens.cli", "run", "main_table", "--model", str(model_dir), "--data",
               str(data), "--limit", "2", "--max-new-tokens", "2", "--out", str(out),
               "--selector", "kvpress:KnormPress", "--selector", "kvpress:SnapKVPress:window_size=16",
               "--selector", "kvpress:ObservedAttentionPress"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = load_tables(out)["answers"]
    assert set(answers.selector) == {"kvpress:KnormPress", "kvpress:SnapKVPress", "kvpress:ObservedAttentionPress"}
    assert set(answers.condition) == {"original", "relay"} and len(answers) == 2 * 3 * 2
    assert "kvpress:SnapKVPress" in done.stdout


SHARED = [("kvpress:KnormPress", {}), ("kvpress:SnapKVPress", {"window_size": 8}), ("kvpress:TOVAPress", {}),
          ("kvpress:LeverageScorePress", {"seed": 3}), ("kvpress:RandomPress", {"seed": 5}),
          ("kvpress:PyramidKVPress", {"window_size": 2, "beta": 2}), ("kvpress:ObservedAttentionPress", {}),
          ("kvpress:StreamingLLMPress", {"n_sink": 500})]  # the last one is too short for a 120-token history


def test_one_shared_pass_keeps_what_separate_passes_keep(kvpress, record):
    """Every press and budget of a record scored together: two history forwards (sdpa, and eager for the press that
    reads attention weights) instead of one per (press, budget), with bit-identical selections, seeded streams
    included; a press that cannot run on the record is left to its own select, which raises."""
    from relaylens.experiments.units import select_units
    from relaylens.selectors.kvpress_pass import share_press_passes

    model, prefill = record
    budgets = [0.25, 0.5]
    units = [(name, b) for name, _ in SHARED for b in budgets]

    def prepared():
        return {name: make_selector(name, **options).prepare(model, prefill) for name, options in SHARED}

    forwards = []
    handle = model.register_forward_pre_hook(lambda *args: forwards.append(1))
    try:
        alone = {}
        for name, b in units:
            try:
                alone[name, b] = prepared()[name].select(prefill, None, b)
            except TooShortError:
                alone[name, b] = None
        separate = len(forwards)
        forwards.clear()
        together = prepared()
        passes, seconds, served = share_press_passes(together, prefill, units)
        shared = len(forwards)
        selections = {(name, b): together[name].select(prefill, None, b) for name, b in units if alone[name, b]}
        assert len(forwards) == shared  # every select was served by the shared passes
    finally:
        handle.remove()
    assert separate == 2 * (len(SHARED) - 1) and (passes, shared) == (2, 2) and seconds > 0
    assert served == {name for name, _ in SHARED[:-1]}
    for (name, b), selection in selections.items():
        assert torch.equal(selection.positions, alone[name, b].positions), (name, b)
        assert torch.equal(selection.valid, alone[name, b].valid), (name, b)
        assert torch.equal(selection.scores, alone[name, b].scores), (name, b)
    work, too_short = select_units(prefill, None, units, prepared())  # the runner's path: same selections
    assert [(w.selector, w.budget) for w in work] == list(selections)
    assert [(n, b) for n, b, _ in too_short] == [(SHARED[-1][0], b) for b in budgets]
    for unit in work:
        assert torch.equal(unit.selection.positions, selections[unit.selector, unit.budget].positions)


def test_presses_reading_config_head_dim_run_on_qwen2(kvpress):
    """Qwen2's config has no ``head_dim`` (the module derives it) and CriticalKVPress reads
    ``module.config.head_dim``: the pass exposes it and takes it away again."""
    from relaylens.model.prefill import prefill_history
    from relaylens.testing import tiny_model

    model = tiny_model("qwen2")
    assert getattr(model.config, "head_dim", None) is None
    prefill = prefill_history(model, torch.randint(3, 300, (96,), generator=torch.Generator().manual_seed(2)),
                              window_size=8)
    press = make_selector("kvpress:CriticalKVPress", press="SnapKVPress", **{"press.window_size": 8})
    selection = press.prepare(model, prefill).select(prefill, None, 0.25)
    assert selection.counts.unique().tolist() == [24]
    assert getattr(model.config, "head_dim", None) is None
