"""--record-order: interleaving over question types happens before --limit, reaches the plan; bad values fail early."""

import json

import pytest
from typer.testing import CliRunner

from relaylens.datasets.ordering import RECORD_ORDERS, order_records
from relaylens.errors import RelaylensError


class _R:
    def __init__(self, record_id, question_type):
        self.record_id, self.question_type = record_id, question_type


def test_interleave_deals_round_robin_and_keeps_every_record():
    types = ["temporal"] * 5 + ["multi"] * 3 + ["user"] * 1 + ["temporal"] * 2
    records = [_R(f"q{i}", t) for i, t in enumerate(types)]
    dealt = order_records(records, "interleave")
    assert sorted(r.record_id for r in dealt) == sorted(r.record_id for r in records)
    assert [r.question_type for r in dealt[:6]] == ["temporal", "multi", "user", "temporal", "multi", "temporal"]
    for t in set(types):  # file order within each type
        in_file = [r.record_id for r in records if r.question_type == t]
        assert [r.record_id for r in dealt if r.question_type == t] == in_file
    assert order_records(records, "file") == records


def test_bad_record_order_names_the_choices():
    with pytest.raises(RelaylensError, match="interleave"):
        order_records([], "shuffled")
    assert RECORD_ORDERS == ("file", "interleave")


def test_run_cli_interleaves_before_the_limit(tmp_path):
    from relaylens.cli import app
    from relaylens.datasets.synthetic import generate_records
    from relaylens.testing import tiny_model, tiny_tokenizer

    model_dir = tmp_path / "tiny-llama"
    tiny_model("llama", seed=0).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    records = sorted(generate_records(n=8, seed=3, history_tokens=800),
                     key=lambda r: r["question_type"], reverse=True)  # temporal-reasoning twice, first
    assert len({r["question_type"] for r in records}) > 1  # a type-sorted file, as LongMemEval's oracle is
    data = tmp_path / "records.json"
    data.write_text(json.dumps(records))
    common = ["run", "coordinate_ablation", "--model", str(model_dir), "--data", str(data), "--condition", "relay",
              "--max-new-tokens", "2", "--selector", "bm25:granularity=turn"]
    bad = CliRunner().invoke(app, [*common, "--record-order", "random", "--out", str(tmp_path / "bad")])
    assert bad.exit_code != 0 and "interleave" in bad.output and not (tmp_path / "bad").exists()
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [*common, "--limit", "3", "--record-order", "interleave", "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    dealt = order_records([_R(r["question_id"], r["question_type"]) for r in records], "interleave")
    assert manifest["plan"]["record_ids"] == [r.record_id for r in dealt[:3]]
    assert manifest["plan"]["record_ids"] != [r["question_id"] for r in records[:3]]  # not the file's first three
    assert manifest["config"]["run"]["record_order"] == "interleave"


def test_auto_decoding_records_a_path_and_a_resumed_run_keeps_its_own(tmp_path):
    """--decoding auto (the default) is resolved before the manifest is written: static on the CPU for a new run, and
    the path a run directory already decodes with when it resumes (a run never changes path mid-way)."""
    from relaylens.cli import app
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments.run_setup import resumed_decoding
    from relaylens.testing import tiny_model, tiny_tokenizer

    model_dir = tmp_path / "tiny-llama"
    tiny_model("llama", seed=0).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    data = tmp_path / "records.json"
    data.write_text(json.dumps(generate_records(n=2, seed=3, history_tokens=600)))
    common = ["run", "coordinate_ablation", "--model", str(model_dir), "--data", str(data), "--condition", "relay",
              "--max-new-tokens", "3", "--selector", "bm25:granularity=turn"]

    def run(out, *extra):
        result = CliRunner().invoke(app, [*common, *extra, "--out", str(out)])
        assert result.exit_code == 0, result.output
        return json.loads((out / "manifest.json").read_text())["config"]["run"]["decoding"]

    assert resumed_decoding(tmp_path / "new") is None
    assert run(tmp_path / "new", "--limit", "1") == "static"
    assert run(tmp_path / "old", "--limit", "1", "--decoding", "dynamic") == "dynamic"
    assert run(tmp_path / "old", "--limit", "1") == "dynamic", "resumed under auto: the directory's own path"
    assert resumed_decoding(tmp_path / "old") == "dynamic"
    bad = CliRunner().invoke(app, [*common, "--limit", "1", "--decoding", "static", "--out", str(tmp_path / "old")])
    assert bad.exit_code != 0 and "decoding" in bad.output, "an explicit other path is a changed setting"
