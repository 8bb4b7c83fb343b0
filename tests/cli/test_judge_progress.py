"""``relaylens judge`` shows its progress: units judged out of the run's units, elapsed time and time left (a pass
over a 150-record, six-selector run takes about an hour on a 2-core CPU). ``rejudge_run``'s own callback, once per
unit file: tests/experiments/test_rejudge.py."""

from __future__ import annotations

import types

from typer.testing import CliRunner

from relaylens.cli import app


def test_the_cli_shows_units_judged_out_of_the_runs_units(tmp_path, monkeypatch):
    import relaylens.experiments.rejudge as rejudge
    import relaylens.model.loading as loading
    from relaylens.testing import tiny_model, tiny_tokenizer

    monkeypatch.setattr(loading, "load_model", lambda spec, dtype=None, **kw: (tiny_model("llama"), tiny_tokenizer()))

    def fake_rejudge(run_dir, backend, name, data=None, progress=None, template=None):
        for done in range(1, 8):
            progress(done, 7)
        return types.SimpleNamespace(judged=14, calls=14, cache_hits=0, failures=[], metrics=[f"judge_{name}"])

    monkeypatch.setattr(rejudge, "rejudge_run", fake_rejudge)
    run_dir = tmp_path / ("a-long-folder-name-" * 6) / "run"  # a long path must not push the bar out of the line
    run_dir.mkdir(parents=True)
    result = CliRunner().invoke(app, ["judge", str(run_dir), "--judge-model", "tiny", "--name", "tiny"],
                                env={"COLUMNS": "120", "HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 0, result.output
    bar = [line for line in result.output.splitlines() if "judge tiny: units" in line]
    assert bar and "7/7" in bar[-1], result.output

