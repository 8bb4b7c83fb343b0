"""Issue 28 items 12, 13, 20: placement options are checked before anything loads. Rope parameters are finite and in
range (``linear:inf`` ran with no positional encoding and wrote ``Infinity`` into the manifest), ``--max-position``
stays within the 2**24 positions float32 phases tell apart, and an attention kernel that cannot run here (flash
attention without flash-attn) is one clear error instead of an ImportError traceback."""

from __future__ import annotations

import json

import pytest

from relaylens.errors import RelaylensError
from relaylens.model.placement import Placement, apply_rope_override, parse_rope_scaling
from relaylens.testing import tiny_config


@pytest.mark.parametrize(("text", "message"), [
    ("linear:inf", r"factor=inf is not a finite number"),
    ("yarn:nan", r"factor=nan is not a finite number"),
    ("yarn:4:inf", r"original_max_position_embeddings=inf is not a finite number"),
    ("linear:1e-300", r"factor=1e-300 must be in 1\.\.16,777,216"),
    ("linear:0.5", r"factor=0\.5 must be in 1\.\."),
    ("yarn:1e30", r"factor=1e\+30 must be in 1\.\.16,777,216"),
    ("yarn:4:0.5", r"original_max_position_embeddings=0\.5 must be a whole number in 1\.\.16,777,216"),
    ("yarn:4:32768.5", r"original_max_position_embeddings=32768\.5 must be a whole number"),
    ("yarn:4:1e12", r"original_max_position_embeddings=1000000000000\.0 must be a whole number"),
    ("llama3:8:4:1:8192", r"high_freq_factor=1 must exceed low_freq_factor=4"),
    ("llama3:8:2:2:8192", r"high_freq_factor=2 must exceed low_freq_factor=2"),
    ("llama3:8:nan:4:8192", r"low_freq_factor=nan is not a finite number"),
    ("yarn:factor=-2", r"factor must be positive"),
])
def test_bad_rope_parameters_are_refused_before_loading(text, message):
    with pytest.raises(RelaylensError, match=message + ".*Fix"):
        parse_rope_scaling(text)
    with pytest.raises(RelaylensError, match=message):
        Placement.resolve("cpu", rope_scaling=text)


def test_rope_parameters_given_as_a_dict_are_checked_too():
    with pytest.raises(RelaylensError, match="factor=inf is not a finite number"):
        parse_rope_scaling({"rope_type": "linear", "factor": float("inf")})
    assert parse_rope_scaling({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768.0}) == \
        {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}


def test_checked_rope_parameters_write_valid_json():
    params = Placement.resolve("cpu", rope_scaling="yarn:4:32768", max_position=131072).to_dict()
    json.loads(json.dumps(params, allow_nan=False))  # what the manifest records: no Infinity, no NaN


@pytest.mark.parametrize("value", [2**24 + 1, 3_000_000_000, 0, -5, 1.5, True])
def test_max_position_is_a_whole_number_within_2_24(value):
    with pytest.raises(RelaylensError, match=r"--max-position must be a whole number of positions in 1\.\.16,777,216"):
        Placement.resolve("cpu", max_position=value)
    with pytest.raises(RelaylensError, match="--max-position"):
        apply_rope_override(tiny_config("llama"), None, value)


def test_max_position_at_the_limit_is_accepted():
    from relaylens.model.placement import check_max_position

    assert check_max_position(2**24) == 2**24 and check_max_position(131072.0) == 131072


@pytest.mark.parametrize(("name", "message"), [
    ("flash_attention_2", r"--attn-implementation flash_attention_2 needs a CUDA GPU and the flash-attn package"),
    ("flash_attention_3", r"--attn-implementation flash_attention_3 needs a CUDA GPU and the flash-attn package"),
    ("flash_attn2", r"'flash_attn2' is not an attention kernel relaylens loads with; choose one of sdpa, eager"),
    ("", r"'' is not an attention kernel"),
])
def test_an_attention_kernel_that_cannot_run_here_is_one_clear_error(name, message):
    pytest.importorskip("transformers")
    try:
        import flash_attn  # noqa: F401
        pytest.skip("flash-attn is installed here")
    except ImportError:
        pass
    with pytest.raises(RelaylensError, match=message + ".*Fix: --attn-implementation sdpa"):
        Placement.resolve("cpu", attn_implementation=name)


@pytest.mark.parametrize(("package", "missing"), [
    (True, "a CUDA GPU; the model goes to cpu"),
    (False, "a CUDA GPU and the flash-attn package; the model goes to cpu")])
def test_flash_attention_refusal_names_what_is_missing(monkeypatch, package, missing):
    """The kernels package (installed with transformers >= 5.25) stands in for flash-attn on a GPU; on a CPU the GPU
    is still missing, and the error says which of the two is."""
    from transformers import utils as hf_utils

    monkeypatch.setattr(hf_utils, "is_kernels_available", lambda: package)
    monkeypatch.setattr(hf_utils, "is_flash_attn_2_available", lambda: False)
    with pytest.raises(RelaylensError, match=f"missing here: {missing} "):
        Placement.resolve("cpu", attn_implementation="flash_attention_2")


def test_load_model_checks_the_kernel_before_loading(tmp_path):
    from relaylens.model.loading import load_model

    with pytest.raises(RelaylensError, match="flash-attn"):
        load_model(str(tmp_path / "no-such-model"), attn_implementation="flash_attention_2")  # refused before the path


def test_the_kernels_relaylens_runs_are_accepted():
    assert [Placement.resolve("cpu", attn_implementation=k).attn_implementation for k in (None, "sdpa", "eager")] == \
        ["sdpa", "sdpa", "eager"]
