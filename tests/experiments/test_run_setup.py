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
