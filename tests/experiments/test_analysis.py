"""The analysis record (relaylens.experiments.analysis): what load_analysis returns, what it refuses, and the
deprecated module-style aliases."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from relaylens import REMOVED_IN
from relaylens.errors import RelaylensError
from relaylens.experiments.analysis import Analysis, CliOption
from relaylens.experiments.learned import LearnOptions
from relaylens.experiments.specs import ExperimentSpec, available_analyses, load_analysis

SPEC = ExperimentSpec("toy", selectors=("streaming",), budgets=(0.5,), conditions=("original",))


@pytest.mark.parametrize("name", available_analyses())
def test_every_analysis_is_a_record_named_like_its_file(name):
    record = load_analysis(name)
    assert isinstance(record, Analysis) and record.name == name and isinstance(record.spec, ExperimentSpec)
    assert record.doc, f"{name}: the record carries the module's docstring"
    assert all(preset.changes for preset in record.presets.values())


def test_learned_geometry_declares_its_own_runner_options_and_flags():
    record = load_analysis("learned_geometry")
    assert callable(record.run) and isinstance(record.options, LearnOptions)
    assert [f.flag for f in record.cli_options] == ["--steps", "--learning-rate", "--sharing", "--batch-records",
                                                    "--eval-every", "--train-fraction", "--answer-tokens"]
    fields = {f.name for f in dataclasses.fields(LearnOptions)}
    assert all(f.field in fields for f in record.cli_options), "every flag sets a field of LearnOptions"
    options = record.with_flags({"steps": 3, "answer_tokens": 5, "sharing": None})
    assert (options.steps, options.max_answer_tokens, options.sharing) == (3, 5, "layer")
    with pytest.raises(RelaylensError, match="has no option nope"):
        record.with_flags({"nope": 1})
    assert load_analysis("overhead").batch_rows == 1 and load_analysis("ordering").batch_rows is None


def test_an_inconsistent_record_is_refused_in_one_line():
    flag = CliOption("temperature", float, "toy")
    with pytest.raises(RelaylensError, match="no options object"):
        Analysis(SPEC, cli_options=(flag,), run=print)
    with pytest.raises(RelaylensError, match="no runner of its own"):
        Analysis(SPEC, options=LearnOptions())
    with pytest.raises(RelaylensError, match="must be callable"):
        Analysis(SPEC, run="relaylens.experiments.learned_run:run_learned_geometry")
    with pytest.raises(RelaylensError, match="batch_rows must be"):
        Analysis(SPEC, batch_rows=0)
    with pytest.raises(RelaylensError, match="not one of int, float, str"):
        CliOption("n", list, "toy")
    with pytest.raises(RelaylensError, match="is not a keyword"):
        CliOption("learning-rate", float, "toy")
    record = Analysis(SPEC, run=print, options=LearnOptions(), cli_options=(CliOption("steps", int, "toy"),))
    assert record.cli_panel == "toy only" and record.cli_options[0].field == "steps"


def test_the_module_style_names_still_work_with_a_warning():
    record = load_analysis("learned_geometry")
    for old, new in [("SPEC", "spec"), ("PRESETS", "presets"), ("RUN", "run"), ("OPTIONS", "options"),
                     ("BATCH_ROWS", "batch_rows")]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert getattr(record, old) is getattr(record, new)
        assert [w.category for w in caught] == [DeprecationWarning], old
        assert f".{old} is deprecated" in str(caught[0].message) and REMOVED_IN in str(caught[0].message)
        assert f"use .{new}" in str(caught[0].message)
