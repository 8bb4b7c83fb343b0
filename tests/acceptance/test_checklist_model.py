"""Real-model tier of test_checklist.py: HelloEval-style checklist judging: the weighted score against a hand
computation, malformed replies as recorded."""

from __future__ import annotations

import json

import pytest
from support.checklist_shared import short_sample  # noqa: F401 - shared with the model tier

pytestmark = pytest.mark.model


@pytest.mark.slow
def test_cli_paper_preset_with_the_stub_judge_and_the_report(tmp_path):
    """``relaylens run summarization --preset paper --limit 2 --max-new-tokens N --judge-model stub`` then
    ``relaylens report``: Tables 10 and 11 are sections of the report; --no-protect-instructions turns it off."""
    import subprocess
    import sys

    from relaylens.testing import tiny_model, tiny_tokenizer

    model_dir = tmp_path / "tiny-llama"
    tiny_model("llama", seed=0).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    data = tmp_path / "summarization.jsonl"
    short_sample(data)

    def cli(*args):
        result = subprocess.run([sys.executable, "-m", "relaylens.cli", *map(str, args)], capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    out = tmp_path / "run"
    cli("run", "summarization", "--preset", "paper", "--limit", "2", "--max-new-tokens", "3", "--model", model_dir,
        "--data", data, "--out", out, "--judge-model", "stub")
    spec = json.loads((out / "manifest.json").read_text())["config"]["spec"]
    assert spec["protect_instructions"] is True and spec["max_new_tokens"] == 3
    assert spec["selectors"] == ["snapkv", "full"]
    cli("report", out)
    html = (out / "report.html").read_text()
    assert "Table 10: summarization" in html and "Table 11: summarization per source category" in html
    off = tmp_path / "off"
    cli("run", "summarization", "--limit", "1", "--max-new-tokens", "2", "--model", model_dir, "--data", data,
        "--out", off, "--no-protect-instructions", "--judge-model", "stub")
    assert "protect_instructions" not in json.loads((off / "manifest.json").read_text())["config"]["spec"]
