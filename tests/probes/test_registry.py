"""The probe registry: the built-in kinds in their order, a toy kind registered for one run and seen in its tables,
and registration that never outlives its ``with`` block."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd
import pytest

from relaylens.errors import RelaylensError
from relaylens.experiments.specs import ExperimentSpec
from relaylens.probes.registry import PROBES, ProbeTables, UnitContext, enabled_probes, registered, run_probes

BUILT_IN = ["replay", "sensitivity", "layer_sweep", "token_view"]


@dataclass(frozen=True)
class KeptStates:
    """A toy kind: how many states the unit keeps, per layer (probe rows) and in all (a score row)."""

    name: str = "kept_states"

    def enabled(self, spec, config) -> bool:
        return True

    def run(self, unit: UnitContext) -> ProbeTables:
        counts = unit.selection.counts.sum(-1)  # [layer]
        frame = pd.DataFrame({"layer": range(len(counts)), "head": -1, "metric": "kept_states",
                              "value": counts.double().tolist(), "condition": "original",
                              "probe_point": "question_final", "source": "toy"})
        score = {"condition": "original", "metric": "kept_states", "value": float(counts.sum())}
        return ProbeTables(probes=(frame,), scores=(score,))


def test_built_in_kinds_in_table_order():
    assert [p.name for p in PROBES] == BUILT_IN


def test_a_registered_kind_shows_in_a_real_run(tmp_path):
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments.config import RunConfig
    from relaylens.experiments.runner import run_analysis
    from relaylens.results.store import load_tables
    from relaylens.testing import tiny_model, tiny_tokenizer

    data = tmp_path / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=5, history_tokens=900)))
    spec = ExperimentSpec("toy_probe", selectors=("bm25",), budgets=(0.4,), conditions=("original", "relay"),
                          probes=True, max_new_tokens=2)
    with registered(KeptStates()):
        out = run_analysis(spec, RunConfig(data=str(data), out=str(tmp_path / "run")), progress=False,
                           model_and_tokenizer=(tiny_model("llama", seed=0), tiny_tokenizer()))
    assert [p.name for p in PROBES] == BUILT_IN  # gone after the block
    tables = load_tables(out)
    answers, scores, probes = tables["answers"], tables["scores"], tables["probes"]
    toy = scores[scores.metric == "kept_states"]
    assert sorted(toy.record_id) == sorted(set(answers.record_id)) and len(toy) == 2
    assert set(toy.condition) == {"original"} and (toy.value > 0).all()
    assert {"question_type", "cluster_id", "selector", "budget"} <= set(toy.columns)  # the runner's key and meta
    rows = probes[probes.source == "toy"]
    assert len(rows) == 2 * 2 and set(rows.layer) == {0, 1}  # records x layers of the tiny model
    per_record = rows.groupby("record_id").value.sum().sort_index()
    assert per_record.tolist() == toy.set_index("record_id").value.sort_index().tolist()
    assert {"forward", "toy"} <= set(probes.source)  # beside the forward readouts, never instead of them


def test_registration_is_scoped_and_names_are_unique():
    with pytest.raises(RelaylensError, match="already registered"):
        with registered(KeptStates(name="replay")):
            pass
    with pytest.raises(ValueError, match="boom"):
        with registered(KeptStates()):
            assert [p.name for p in PROBES] == [*BUILT_IN, "kept_states"]
            raise ValueError("boom")
    assert [p.name for p in PROBES] == BUILT_IN
    with pytest.raises(RelaylensError, match="not a probe kind"):
        with registered(object()):
            pass


def test_enabled_follows_the_spec():
    from relaylens.experiments.config import RunConfig

    spec = ExperimentSpec("toy_probe", selectors=("bm25",), budgets=(0.4,), conditions=("original", "relay"),
                          probes=True, replay_conditions=("relay",))
    config = RunConfig()
    assert [p.name for p in enabled_probes(spec, config)] == ["replay", "token_view"]
    spec = spec.replace(probes=False, sensitivity=True, sweep="layers")
    assert [p.name for p in enabled_probes(spec, config)] == ["sensitivity", "layer_sweep"]


def test_a_kind_returning_something_else_is_refused():
    @dataclass(frozen=True)
    class Wrong:
        name: str = "wrong"

        def enabled(self, spec, config):
            return True

        def run(self, unit):
            return []

    with pytest.raises(RelaylensError, match="returned list, expected ProbeTables"):
        run_probes(None, [Wrong()])
