"""Running as the paper ran: skipped records (too long, too short) recorded and not retried silently, CLI overrides
and rotary overrides in the manifest, and every analysis's paper preset end to end on a tiny model."""

from __future__ import annotations

import json

import pytest
from support.runner_paper_shared import workspace_fixture  # noqa: F401 - pytest fixture (named workspace)
from support.runs import cli  # tests/ is on sys.path under pytest (tests/conftest.py)

from relaylens.results.store import load_tables


def _run(model_dir, data, out, *extra):
    # session granularity named: BM25's default (auto) would fall back to turns and answer the short record
    return cli("run", "coordinate_ablation", "--model", model_dir, "--data", data, "--out", out, "--max-new-tokens",
               "2", "--selector", "bm25:granularity=session",
                "--budget", "0.4", "--condition", "relay", *extra)


def test_records_that_do_not_fit_are_skipped_recorded_and_not_retried(workspace):
    root, model_dir, data = workspace
    out = root / "skips"
    first = _run(model_dir, data, out, "--max-history-tokens", "5000")
    tables = load_tables(out)
    skipped = tables["skipped"].set_index("record_id")
    assert set(skipped.index) == {"the_long_one", "the_short_one"}
    assert skipped.loc["the_long_one",
                       "reason"] == "too_long" and "--max-history-tokens 5000" in skipped.loc["the_long_one", "detail"]
    assert skipped.loc["the_short_one", "reason"] == "too_short"
    assert skipped.loc["the_long_one", "history_length"] > 5000
    assert set(tables["answers"].record_id) & set(skipped.index) == set(), "skipped records have no answers"
    assert tables["answers"].record_id.nunique() == 2
    assert "the_long_one: too_long" in first.stdout and "the_short_one: too_short" in first.stdout
    # resume: nothing is recomputed, the skips stay recorded
    units = {p.name: p.stat().st_mtime_ns for p in (out / "units").iterdir()}
    again = _run(model_dir, data, out, "--max-history-tokens", "5000")
    assert {p.name: p.stat().st_mtime_ns for p in (out / "units").iterdir()} == units
    assert "the_long_one: too_long" in again.stdout
    # a deliberate retry with a larger limit runs the long record
    _run(model_dir, data, out, "--max-history-tokens", "100000", "--force", "--retry-skipped")
    tables = load_tables(out)
    assert set(tables["skipped"].record_id) == {"the_short_one"}
    assert "the_long_one" in set(tables["answers"].record_id)


def test_overrides_are_in_the_manifest(workspace):
    root, model_dir, data = workspace
    out = root / "overrides"
    cli("run", "ordering", "--model", model_dir, "--data", data, "--out", out, "--limit", "1", "--max-new-tokens", "2",
         "--selector", "bm25:k1=1.2,granularity=turn", "--condition", "relay", "--condition", "reverse_order",
         "--granularity", "session", "--stop", "eos", "--budget", "0.4", "--dtype", "bfloat16")
    manifest = json.loads((out / "manifest.json").read_text())
    spec = manifest["config"]["spec"]
    assert spec["selectors"] == ["bm25"] and spec["selector_options"] == {"bm25": {"k1": 1.2, "granularity": "turn"}}
    assert spec["conditions"] == ["original", "relay", "reverse_order"]
    assert (spec["granularity"], spec["stop"]) == ("session", "eos")
    assert manifest["config"]["placement"]["dtype"] == "bfloat16"
    from relaylens.model.packed import packing_available

    decoding = manifest["config"]["decoding"]  # what the decoding steps ran: bfloat16 on the CPU packs where it can
    assert decoding["linear_layers"] == ("prepacked bfloat16 (oneDNN)" if packing_available() else "F.linear")
    assert decoding["unobserved_attention"].startswith("fused")
    answers = load_tables(out)["answers"]
    assert set(answers.condition) == {"original", "relay", "reverse_order"}


def test_rope_override_reaches_the_model_and_the_manifest(workspace, tmp_path):
    from transformers import AutoModelForCausalLM

    from relaylens.testing import tiny_config, tiny_tokenizer

    root, _, data = workspace
    config = tiny_config("qwen2_yarn", max_position_embeddings=32768)
    config.rope_parameters = {"rope_type": "default", "rope_theta": 1e6}
    model_dir = tmp_path / "plain-qwen2"
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    out = tmp_path / "yarn"
    cli("run", "coordinate_ablation", "--model", model_dir, "--data", data, "--out", out, "--limit", "1",
         "--max-new-tokens", "2", "--budget", "0.4", "--rope-scaling", "yarn:4:32768", "--max-position", "131072")
    manifest = json.loads((out / "manifest.json").read_text())["config"]
    assert manifest["placement"]["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 32768}
    assert manifest["rope"]["rope_parameters"]["rope_type"] == "yarn"
    assert manifest["rope"]["max_position_embeddings"] == 131072


@pytest.mark.parametrize(("args", "message"), [
    (["--device", "tpu"], "not a device"),
    (["--dtype", "int4"], "--dtype"),
    (["--rope-scaling", "yarn:x"], "not a number"),
    (["--selector", "bm25:nope=1"], "no hyperparameter"),
    (["--preset", "fast"], "no preset"),
    (["--stop", "later"], "stop"),
])
def test_bad_options_give_one_clear_line(args, message):
    result = cli("run", "coordinate_ablation", *args, check=False)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_a_budget_too_small_for_a_record_is_skipped_not_fatal(workspace, tmp_path):
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis
    from relaylens.testing import tiny_model, tiny_tokenizer

    _, _, data = workspace
    # the framing evicted: the budget is a ratio of the whole history, too small for SnapKV's window
    spec = load_analysis("main_table").spec.replace(selectors=("snapkv", "bm25"), budgets=(0.01,), max_new_tokens=2,
                                                    protect_instructions=False)
    out = run_analysis(spec, RunConfig(data=str(data), out=str(tmp_path / "tiny_budget"), limit=2,
                                       max_history_tokens=5000), progress=False,
                       model_and_tokenizer=(tiny_model("llama"), tiny_tokenizer()))
    tables = load_tables(out)
    snap = tables["skipped"][tables["skipped"].selector == "snapkv"]
    assert len(snap) == 2 and set(snap.reason) == {"too_short"}
    assert all(d.startswith(f"record {r}: snapkv @ 0.01:") and "observation window" in d
               for r, d in zip(snap.record_id, snap.detail))
    # BM25 at 1% of an ~2,500-token history fits no whole session either: recorded, not fatal
    assert set(tables["answers"].selector) | set(tables["skipped"].selector) == {"snapkv", "bm25"}
