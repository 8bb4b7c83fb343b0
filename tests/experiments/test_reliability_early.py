"""Issue 28 items 12, 13, 15, 19, 20: bad options fail before the model loads, in seconds, with one clear line (exit 2,
no traceback), from the CLI (`run`, `model check`) and from Python (`run_analysis`). The model loader is replaced by
one that fails the test, so a case that reaches it (the old behaviour: a traceback after the prefill, or a run that
exits 0 with no positional encoding) cannot pass."""

from __future__ import annotations

import json

import pytest

from relaylens.errors import RelaylensError

CASES = [
    # item 12: rope parameters finite and in range
    ("rope-linear-inf", ["--rope-scaling", "linear:inf"], ["--rope-scaling 'linear:inf'", "factor=inf", "Fix"]),
    ("rope-yarn-nan", ["--rope-scaling", "yarn:nan"], ["factor=nan", "not a finite number", "Fix"]),
    ("rope-linear-tiny", ["--rope-scaling", "linear:1e-300"], ["factor=1e-300", "1..16,777,216", "Fix"]),
    ("rope-yarn-half-context", ["--rope-scaling", "yarn:4:0.5"], ["original_max_position_embeddings=0.5",
                                                                  "whole number", "Fix"]),
    ("rope-llama3-inverted", ["--rope-scaling", "llama3:8:4:1:8192"], ["high_freq_factor=1", "low_freq_factor=4"]),
    # item 13: positions float32 phases cannot tell apart
    ("max-position-past-2-24", ["--max-position", str(2**24 + 1)], ["--max-position", "16,777,216", "Fix"]),
    ("max-position-3e9", ["--max-position", "3000000000"], ["--max-position", "got 3000000000"]),
    ("condition-shift-past-2-24", ["--condition", "query_only(3000000000)"], ["query_only(3000000000)", "2**24",
                                                                              "Fix"]),
    # item 15: the question follows every kept key
    ("condition-query-only-negative", ["--condition", "query_only(-5)"], ["query_only(-5)", "shift must be a whole "
                                                                          "number of positions >= 0", "Fix"]),
    ("condition-common-shift-negative", ["--condition", "common_shift(-1)"], ["common_shift(-1)", ">= 0"]),
    # item 19: selector arguments
    ("selector-random-float-seed", ["--selector", "random:seed=1.5"], ["selector 'random'", "seed=1.5",
                                                                       "whole number", "Fix"]),
    ("selector-cam-float-seed", ["--selector", "cam:seed=1.5"], ["selector 'cam'", "seed=1.5", "Fix"]),
    ("selector-random-negative-seed", ["--selector", "random:seed=-1"], ["seed=-1", "0..2**63-1"]),
    ("selector-bm25-nan-k1", ["--selector", "bm25:k1=nan"], ["selector 'bm25'", "k1=nan", "finite"]),
    ("run-negative-seed", ["--seed", "-1"], ["seed", "-1", "Fix"]),
    # item 20: an attention kernel that cannot run here
    ("attn-flash-attention-2", ["--attn-implementation", "flash_attention_2"],
     ["--attn-implementation flash_attention_2", "flash-attn", "Fix: --attn-implementation sdpa"]),
    ("attn-unknown", ["--attn-implementation", "flash"], ["'flash' is not an attention kernel", "sdpa"]),
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    from relaylens.datasets.synthetic import generate_records

    root = tmp_path_factory.mktemp("early")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=3, history_tokens=800)))
    (root / "model").mkdir()  # never loaded: every case fails before
    return root, data


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded: the bad option was not refused before loading")

    monkeypatch.setattr("relaylens.model.loading.load_model", refuse)


def _invoke(args):
    from typer.testing import CliRunner

    from relaylens.cli import app

    result = CliRunner().invoke(app, args, env={"COLUMNS": "80", "HF_HUB_OFFLINE": "1"})
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


@pytest.mark.parametrize(("args", "fragments"), [pytest.param(a, f, id=n) for n, a, f in CASES])
def test_bad_run_option_is_one_line_before_the_model_loads(workspace, args, fragments):
    root, data = workspace
    out = root / "runs" / "x"
    line = _invoke(["run", "ordering", "--model", str(root / "model"), "--data", str(data), "--limit", "1",
                    "--out", str(out), *args])
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} missing from: {line}"
    assert not out.exists()


@pytest.mark.parametrize(("args", "fragment"), [
    (["--rope-scaling", "linear:inf"], "factor=inf"), (["--max-position", str(2**24 + 1)], "--max-position"),
    (["--attn-implementation", "flash_attention_2"], "flash-attn")])
def test_model_check_refuses_bad_placement_before_loading(workspace, args, fragment):
    assert fragment in _invoke(["model", "check", str(workspace[0] / "model"), *args])


@pytest.mark.parametrize(("config", "message"), [
    (dict(rope_scaling="linear:inf"), "factor=inf"), (dict(rope_scaling="yarn:4:0.5"), "whole number"),
    (dict(max_position=2**24 + 1), "--max-position"), (dict(attn_implementation="flash_attention_2"), "flash-attn"),
    (dict(seed=1.5), "seed must be a whole number")])
def test_run_analysis_refuses_bad_placement_before_loading(workspace, config, message):
    from relaylens.experiments.config import RunConfig
    from relaylens.experiments.runner import run_analysis
    from relaylens.experiments.specs import load_analysis

    root, data = workspace
    out = root / "runs" / "py"
    with pytest.raises(RelaylensError, match=message):
        run_analysis(load_analysis("ordering").spec, RunConfig(model=str(root / "model"), data=str(data), out=str(out),
                                                              **config), progress=False)
    assert not out.exists()


def test_an_error_inside_a_record_names_the_record(workspace, monkeypatch, tmp_path):
    """Errors raised while a record runs (a position past the range, a non-finite cache) say which record it was."""
    from relaylens.errors import PositionError
    from relaylens.experiments.config import RunConfig
    from relaylens.experiments.runner import run_analysis
    from relaylens.experiments.specs import load_analysis
    from relaylens.testing import tiny_model, tiny_tokenizer

    def fail(*args, **kwargs):
        raise PositionError("condition relay, layer 1: target positions reach position 99")

    monkeypatch.setattr("relaylens.experiments.record_rows.run_rows", fail)  # the decode corridor's own reference
    spec = load_analysis("ordering").spec.replace(budgets=(0.4,), max_new_tokens=2, probes=False, replay_conditions=(),
                                                  teacher_forcing=False, attribution=False)
    config = RunConfig(model="tiny", data=str(workspace[1]), out=str(tmp_path / "run"), limit=1)
    with pytest.raises(PositionError, match=r"^record \S+: condition relay, layer 1: target positions"):
        run_analysis(spec, config, progress=False, model_and_tokenizer=(tiny_model("llama"), tiny_tokenizer()))
