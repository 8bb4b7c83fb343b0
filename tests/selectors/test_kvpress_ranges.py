"""kvpress press arguments are range-checked (issue 41, item 15): zero or negative sizes, even pooling kernels,
ratios outside [0, 1] and non-finite numbers fail when the selector is built (when ``--selector`` is parsed, before
the model loads), one line each naming press, argument, value, range and fix; windows and sinks that reach past a
record's history (only the record knows its length) skip that unit, naming record and press -- inner presses too.

The refused-press messages of item 17 are here as well: grammatical, and "did you mean" never suggests a refused
press."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from relaylens.errors import TooShortError
from relaylens.selectors import PressError, make_selector
from relaylens.selectors.kvpress_adapter import REFUSED, SCORERS, import_kvpress


@pytest.fixture(scope="module")
def kvpress():
    try:
        return import_kvpress()
    except PressError as err:
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(f"CI=true requires kvpress in relaylens's environment: {err}", pytrace=False)
        pytest.skip(str(err))


BAD = [
    ("SnapKVPress", {"window_size": 0}), ("SnapKVPress", {"window_size": -8}), ("SnapKVPress", {"kernel_size": 0}),
    ("SnapKVPress", {"kernel_size": 4}), ("PyramidKVPress", {"beta": 0}), ("PyramidKVPress", {"window_size": -1}),
    ("ExpectedAttentionPress", {"n_future_positions": 0}), ("ExpectedAttentionPress", {"n_sink": -1}),
    ("ExpectedAttentionPress", {"epsilon": -0.5}), ("ExpectedAttentionPress", {"epsilon": float("nan")}),
    ("StreamingLLMPress", {"n_sink": -4}), ("LagKVPress", {"lag_size": 0}), ("NonCausalAttnPress", {"chunk_size": 0}),
    ("LeverageScorePress", {"sketch_dimension": 0}), ("CompactorPress", {"blending": 1.5}),
    ("CompactorPress", {"sink_size_start": -1}), ("CompactorPress", {"chunk_size": -256}),
    ("CURPress", {"num_sinks": -1}), ("CURPress", {"local_window_size": 0}), ("CapPress", {"tau": 0.0}),
    ("CapPress", {"epsilon": float("inf")}), ("CriticalKVPress", {"press": "KnormPress", "first_stage_ratio": 1.5}),
    ("CriticalKVPress", {"press": "KnormPress", "first_stage_ratio": -0.1}),
    ("CriticalKVPress", {"press": "SnapKVPress", "press.window_size": 0}),
]


@pytest.mark.parametrize("press, options", BAD, ids=[f"{p}-{'-'.join(map(str, o.items()))}" for p, o in BAD])
def test_an_argument_out_of_range_is_one_clear_error_when_built(kvpress, press, options):
    key, value = next((k, v) for k, v in options.items() if k != "press")
    label = "kvpress:SnapKVPress" if key.startswith("press.") else f"kvpress:{press}"
    with pytest.raises(PressError) as err:
        make_selector(f"kvpress:{press}", **options)
    message = str(err.value)
    name = key.removeprefix("press.")
    assert message.startswith(f"{label}: {name}={value!r} is out of range: it must be "), message
    assert "Fix:" in message and "\n" not in message


def test_in_range_arguments_still_build(kvpress):
    for press, options in [("SnapKVPress", {"window_size": 1, "kernel_size": 1}), ("CompactorPress", {"blending": 0.0}),
                           ("CriticalKVPress", {"press": "KnormPress", "first_stage_ratio": 0.0}),
                           ("StreamingLLMPress", {"n_sink": 0}), ("CapPress", {"tau": 0.5})]:
        make_selector(f"kvpress:{press}", **options)


def test_the_command_line_refuses_it_when_parsing(kvpress):
    from relaylens.experiments.specs import ExperimentSpec, apply_overrides

    spec = ExperimentSpec("demo", selectors=("snapkv",), budgets=(0.1,), conditions=("original", "relay"))
    with pytest.raises(PressError, match=r"window_size=0 is out of range"):
        apply_overrides(spec, selectors=["kvpress:SnapKVPress:window_size=0"])


@pytest.fixture(scope="module")
def record():
    """A tiny random Llama and the prefill of a 120-token history."""
    from relaylens.model.prefill import prefill_history
    from relaylens.testing import peaked_model

    model = peaked_model(num_hidden_layers=2)
    ids = torch.randint(3, 384, (120,), generator=torch.Generator().manual_seed(1))
    return model, prefill_history(model, ids, window_size=8)


@pytest.mark.parametrize("press, options, why", [
    ("SnapKVPress", {"window_size": 120}, "window_size=120"),
    ("LagKVPress", {"lag_size": 64}, r"n_sink \+ 2 x lag_size = 132"),
    ("CompactorPress", {"sink_size_start": 60, "sink_size_end": 60}, "sink_size_start \\+ sink_size_end = 120"),
    ("CURPress", {"num_sinks": 200}, "num_sinks=200"),
    ("CriticalKVPress", {"press": "SnapKVPress", "press.window_size": 150}, "window_size=150"),
])
def test_windows_past_the_history_are_too_short_at_selection(kvpress, record, press, options, why):
    model, prefill = record
    selector = make_selector(f"kvpress:{press}", **options).prepare(model, prefill)
    with pytest.raises(TooShortError, match=rf"kvpress:{press} .*{why}.*got L=120"):  # the runner skips the unit
        selector.select(prefill, None, 0.5)


def test_a_run_skips_the_unit_naming_record_and_press(kvpress, tmp_path):
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis
    from relaylens.results.store import load_tables
    from relaylens.testing import tiny_model, tiny_tokenizer

    data = tmp_path / "records.json"
    data.write_text(json.dumps(generate_records(n=1, seed=3, history_tokens=600)))
    spec = load_analysis("main_table").spec.replace(
        selectors=("kvpress:KnormPress", "kvpress:LagKVPress"), budgets=(0.4,), max_new_tokens=2,
        conditions=("original",), selector_options={"kvpress:LagKVPress": {"lag_size": 4096}})
    out = run_analysis(spec, RunConfig(model="tiny", data=str(data), out=str(tmp_path / "run")), progress=False,
                       model_and_tokenizer=(tiny_model("llama", seed=0), tiny_tokenizer()))
    tables = load_tables(out)
    assert set(tables["answers"].selector) == {"kvpress:KnormPress"}
    skipped = tables["skipped"]
    assert list(skipped.reason) == ["too_short"], skipped
    detail = skipped.detail.iloc[0]
    assert detail.startswith(f"record {skipped.record_id.iloc[0]}: kvpress:LagKVPress @ 0.4: ") and "lag_size" in detail


# ------------------------------------------------------------------------------------- messages (issue 41, item 17)
def test_every_refusal_reads_as_a_sentence():
    """Each reason completes "kvpress:<Press> cannot be a relaylens selector: it ...": a verb comes first."""
    for press, reason in REFUSED.items():
        first = reason.split()[0]
        assert re.fullmatch(r"[a-z-]+s", first) and first not in ("its", "wrappers", "presses"), f"{press}: it {reason}"


@pytest.mark.parametrize("typo", ["ThinkPres", "FinchPres", "AdaKVPres", "DecodingPres", "ChunkKVPres"])
def test_did_you_mean_never_suggests_a_refused_press(kvpress, typo):
    with pytest.raises(PressError) as err:
        make_selector(f"kvpress:{typo}")
    suggested = re.search(r"did you mean ([^?]*)\?", str(err.value))
    names = suggested.group(1).split(", ") if suggested else []
    assert not set(names) & set(REFUSED), str(err.value)
    assert set(names) <= set(SCORERS), str(err.value)
