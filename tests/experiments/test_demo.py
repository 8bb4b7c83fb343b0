"""The demo ends by pointing at the committed Qwen runs: each folder exists in the repository and its manifest says it
was produced by exactly the command the demo prints (analysis, model, dtype, data, limit, seed, selector options,
granularity, prompt mode)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from relaylens.experiments.demo import QWEN_RUNS
from relaylens.experiments.specs import parse_selector_arg

ROOT = Path(__file__).resolve().parents[2]


def _options(command: str) -> tuple[str, dict]:
    words = shlex.split(command)
    assert words[:2] == ["relaylens", "run"], command
    flags = [w for w in words if w == "--no-protect-instructions"]  # the one option without a value
    words = [w for w in words if w not in flags]
    pairs = list(zip(words[3::2], words[4::2]))
    options = dict(pairs) | dict.fromkeys(flags, True)
    options["--selector"] = [value for key, value in pairs if key == "--selector"]  # repeatable, in order
    return words[2], options


@pytest.mark.parametrize(("folder", "what", "command"), QWEN_RUNS, ids=[f for f, _, _ in QWEN_RUNS])
def test_printed_command_is_the_committed_runs_command(folder, what, command):
    manifest = json.loads((ROOT / folder / "manifest.json").read_text())
    analysis, options = _options(command)
    run, spec = manifest["config"]["run"], manifest["config"]["spec"]
    assert manifest["analysis"] == analysis
    assert (run["model"], run["dtype"], run["data"]) == (options["--model"], options["--dtype"], options["--data"])
    assert (run["limit"], run["seed"]) == (int(options["--limit"]), int(options["--seed"]))
    selectors = [parse_selector_arg(option) for option in options["--selector"]]  # the CLI's own reading
    assert spec["selectors"] == [name for name, _ in selectors]
    assert spec["selector_options"] == {name: values for name, values in selectors if values}
    assert (spec["granularity"], spec["prompt_mode"]) == (options["--granularity"], options["--prompt-mode"])
    # the regime: the framing protected unless the command says otherwise, answers of the default 512 tokens or the
    # command's cap (runs made before protection was the default record None for it)
    assert bool(spec.get("protect_instructions")) == ("--no-protect-instructions" not in options)
    assert spec["max_new_tokens"] == int(options.get("--max-new-tokens", 512))
    if "--train-fraction" in options:  # learned_geometry: its own options live in learned_geometry.json
        learned = json.loads((ROOT / folder / "learned_geometry.json").read_text())
        assert learned["options"]["train_fraction"] == float(options["--train-fraction"])
