"""Round 5 (issue 52, item 20): ``relaylens figures RUN --metric judge_NAME`` on a run whose judge pass failed says
what is true -- the pass ran and every verdict failed, with the fix -- never "the run has no 'judge_NAME' scores" while
listing ``judge_NAME`` as present; a metric whose rows are all NaN without a pass record is named as such."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from relaylens.cli import app
from relaylens.errors import RelaylensError
from relaylens.results.store import RunStore
from tests.support.runs import fill, manifest


class Unparsable:
    """A judge whose every reply fails to parse as a verdict."""

    model_id = "unparsable"

    def complete(self, system, user):
        return "no idea"


@pytest.fixture(scope="module")
def failed_pass_run(tmp_path_factory):
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments.rejudge import rejudge_run
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("failed-pass")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=3, history_tokens=600)))
    spec = load_analysis("ordering").spec.replace(budgets=(0.4,), max_new_tokens=2, conditions=("original", "relay"),
                                                  replay_conditions=())
    run = run_analysis(spec, RunConfig(model="tiny", data=str(data), limit=2, out=str(root / "run")), progress=False,
                       model_and_tokenizer=(tiny_model("llama", seed=0), tiny_tokenizer()))
    result = rejudge_run(run, Unparsable(), "loc")
    assert result.judged and len(result.failures) == result.judged  # the pass ran, and every verdict failed
    return run


@pytest.mark.parametrize("metric", ["judge_loc", "contains,judge_loc"])
def test_a_failed_judge_pass_is_named_as_failed(failed_pass_run, metric):
    from relaylens.reporting.figures import write_figures

    with pytest.warns(UserWarning, match="judge pass loc failed"), pytest.raises(RelaylensError) as err:
        write_figures(failed_pass_run, metric=metric, formats=["png"])
    message = str(err.value)
    assert message.startswith("--metric judge_loc: judge pass loc failed: all 4 of its verdicts failed"), message
    assert "has no 'judge_loc' scores" not in message and "Fix: judge again" in message
    assert not (failed_pass_run / "figures").exists()


def test_the_figures_command_prints_the_true_state(failed_pass_run):
    result = CliRunner().invoke(app, ["figures", str(failed_pass_run), "--metric", "judge_loc", "--format", "png"],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert "judge pass loc failed: all 4 of its verdicts failed" in result.output
    assert "has no 'judge_loc' scores" not in result.output


def test_a_metric_of_nan_rows_only_is_named_as_such(tmp_path):
    """No pass record (an inline judge whose every verdict failed): the rows exist, every value is NaN."""
    from relaylens.reporting.figures import write_figures

    run = tmp_path / "run"
    fill(RunStore.create_or_open(run, manifest()), ["r1", "r2"])  # its "judge" scores are all NaN
    with pytest.raises(RelaylensError) as err:
        write_figures(run, metric="judge", formats=["png"])
    message = str(err.value)
    assert "every 'judge' score of the run is NaN" in message and "choose one of ['f1']" in message, message
    with pytest.raises(RelaylensError, match="the run has no 'exact_match' scores"):  # absent: said as before
        write_figures(run, metric="em", formats=["png"])
