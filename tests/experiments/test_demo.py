"""The demo ends by pointing at the committed Qwen runs: each folder exists in the repository and its manifest says it
was produced by exactly the command the demo prints (analysis, model, dtype, data, limit, seed, selector options,
granularity, prompt mode)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from relaylens.experiments.demo import QWEN_RUNS

ROOT = Path(__file__).resolve().parents[2]


def _options(command: str) -> tuple[str, dict]:
    words = shlex.split(command)
    assert words[:2] == ["relaylens", "run"], command
    pairs = dict(zip(words[3::2], words[4::2]))
    return words[2], pairs


@pytest.mark.parametrize(("folder", "what", "command"), QWEN_RUNS, ids=[f for f, _, _ in QWEN_RUNS])
def test_printed_command_is_the_committed_runs_command(folder, what, command):
    manifest = json.loads((ROOT / folder / "manifest.json").read_text())
    analysis, options = _options(command)
    run, spec = manifest["config"]["run"], manifest["config"]["spec"]
    assert manifest["analysis"] == analysis
    assert (run["model"], run["dtype"], run["data"]) == (options["--model"], options["--dtype"], options["--data"])
    assert (run["limit"], run["seed"]) == (int(options["--limit"]), int(options["--seed"]))
    selector, _, clause = options["--selector"].partition(":")
    key, _, value = clause.partition("=")
    assert spec["selectors"] == [selector] and spec["selector_options"] == {selector: {key: value}}
    assert (spec["granularity"], spec["prompt_mode"]) == (options["--granularity"], options["--prompt-mode"])
    if "--train-fraction" in options:  # learned_geometry: its own options live in learned_geometry.json
        learned = json.loads((ROOT / folder / "learned_geometry.json").read_text())
        assert learned["options"]["train_fraction"] == float(options["--train-fraction"])
