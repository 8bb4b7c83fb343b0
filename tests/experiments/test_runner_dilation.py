"""The dilation(k) family end to end: a run with original / relay / key_only at k = 1, 4, 14 on a tiny Qwen2-geometry
model whose rotary range is too short for k = 14 until a static YaRN override extends it (the setting of the real
records' dilation run). The question starts are checked against the closed forms of docs/concepts/conditions.md,
computed here from the answers' own history length and retained count, not by the code under test."""

from __future__ import annotations

import json

import pytest

from relaylens.testing import tiny_model, tiny_tokenizer

CONDITIONS = ("original", "relay", "key_only", "dilation(4)", "key_only(4)", "dilation(14)", "key_only(14)")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    from relaylens.datasets.synthetic import generate_records

    root = tmp_path_factory.mktemp("dilation_run")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=1, seed=3, history_tokens=800)))
    model_dir = root / "model"
    tiny_model("qwen2", max_position_embeddings=4096).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    return root, data, model_dir


def _run(workspace, name, *extra):
    from typer.testing import CliRunner

    from relaylens.cli import app

    root, data, model_dir = workspace
    out = root / name
    args = ["run", "coordinate_ablation", "--model", str(model_dir), "--data", str(data), "--max-new-tokens", "2",
            "--limit", "1", "--out", str(out), *extra]
    for condition in CONDITIONS:
        args += ["--condition", condition]
    return CliRunner().invoke(app, args), out


def test_dilation_past_the_rotary_range_is_skipped_with_the_override_as_fix(workspace):
    result, _ = _run(workspace, "no_override")
    assert result.exit_code != 0
    assert "condition dilation(4) starts the question at" in result.output
    assert "past the model's rotary range (4096 positions)" in result.output
    assert "--rope-scaling yarn:FACTOR:ORIGINAL_MAX --max-position N" in result.output


def test_dilation_with_static_yarn_places_the_question_where_the_closed_forms_put_it(workspace):
    from relaylens.results.store import load_tables

    result, out = _run(workspace, "yarn", "--rope-scaling", "yarn:16:4096", "--max-position", "65536")
    assert result.exit_code == 0, result.output[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["rope"]["rope_parameters"]["rope_type"] == "yarn"
    assert manifest["config"]["rope"]["max_position_embeddings"] == 65536

    answers = load_tables(out)["answers"].set_index("condition")
    assert set(answers.index) == set(CONDITIONS)
    L, M = int(answers.loc["original", "history_length"]), int(answers.loc["original", "max_count"])
    assert 0 < M < L
    expected = {"original": L, "relay": M, "key_only": L}
    for k in (4, 14):
        expected[f"dilation({k})"] = expected[f"key_only({k})"] = k * L - (k - 1) * M
    assert expected["key_only(14)"] > 4096  # past the model's own range: only the override lets it run
    for condition, start in expected.items():
        assert int(answers.loc[condition, "question_start"]) == start, condition
