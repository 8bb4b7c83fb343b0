"""Layers without positional encoding (issue 14, item 11): SmolLM3 ``no_rope_layers``, Cohere-2 and EXAONE-4 global
layers apply no rotary, so their keys must never be rotated by relocation.

The reference is independent of relaylens: the keys the model itself caches when the same tokens run at shifted
positions (RoPE attention depends on relative positions only, so the hidden states are unchanged and only the rotary
of each layer moves its keys).
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from relaylens.errors import RopeError
from relaylens.geometry.rotary import RotaryFactors, relocate_keys
from relaylens.testing import NOPE_VARIANTS, tiny_model, tiny_tokenizer

SHIFT = 700
IDS = torch.arange(3, 60)  # [T]


def _cache_keys(model, shift: int) -> list[torch.Tensor]:
    positions = torch.arange(IDS.numel())[None] + shift
    with torch.no_grad():
        cache = model(IDS[None], position_ids=positions, use_cache=True, cache=DynamicCache()).past_key_values
    return [layer.keys[0] for layer in cache.layers]  # per layer [kv_head, T, head_dim]


@pytest.mark.parametrize("variant", NOPE_VARIANTS + ("llama", "gemma3"))
def test_relocation_matches_the_models_own_keys_at_shifted_positions(variant):
    model = tiny_model(variant)
    factors = RotaryFactors.from_model(model)
    at_zero, shifted = _cache_keys(model, 0), _cache_keys(model, SHIFT)
    source = torch.arange(IDS.numel())
    for layer, (keys, reference) in enumerate(zip(at_zero, shifted)):
        moved = relocate_keys(keys, source, source + SHIFT, factors, layer=layer if factors.per_layer else None)
        error = float((moved - reference).abs().max() / reference.abs().max())
        assert error < 1e-4, f"{variant} layer {layer}: relative error {error:.3g} against the model's own keys"


@pytest.mark.parametrize("variant", NOPE_VARIANTS)
def test_nope_layers_are_detected_and_left_unmoved(variant):
    model = tiny_model(variant)
    factors = RotaryFactors.from_model(model)
    assert factors.nope_layers == {1, 3}
    keys = torch.randn(2, 5, factors.head_dim)
    assert torch.equal(relocate_keys(keys, torch.arange(5), torch.arange(5) + 40, factors, layer=1), keys)
    assert not torch.equal(relocate_keys(keys, torch.arange(5), torch.arange(5) + 40, factors, layer=0), keys)
    with pytest.raises(RopeError, match=r"without positional encoding \(NoPE: layers \[1, 3\]\).*layer=<index>"):
        relocate_keys(keys, torch.arange(5), torch.arange(5) + 40, factors)


@pytest.mark.parametrize("variant", NOPE_VARIANTS)
def test_common_shift_of_everything_leaves_the_logits_unchanged(variant):
    """Through the runtime: keep-all ``common_shift`` (every key and the question moved by the same amount) reads
    exactly what ``original`` reads, NoPE layers included."""
    from relaylens.generation.single import run_condition
    from relaylens.geometry.selection import Selection
    from relaylens.model.prefill import prefill_history

    model = tiny_model(variant)
    prefill = prefill_history(model, IDS, capture_window_queries=False)  # no query recipe for these classes
    full = Selection.full(prefill.history_length, prefill.num_layers, prefill.num_kv_heads)
    question = torch.arange(10, 20)
    logits = {c: run_condition(model, prefill, full, c, question, max_new_tokens=0,
                               keep_question_logits=True).question_logits
              for c in ("original", "common_shift(shift=300)")}
    error = float((logits["original"] - logits["common_shift(shift=300)"]).abs().max())
    assert error < 1e-4 * float(logits["original"].abs().max()), error


def test_model_check_passes_on_nope_models_and_fails_when_nope_is_ignored(monkeypatch, tmp_path):
    """``relaylens model check`` prints PASS/FAIL against thresholds and exits non-zero when a check fails."""
    from typer.testing import CliRunner

    from relaylens.cli import app
    from relaylens.geometry import rotary as geometry

    model_dir = tmp_path / "tiny-smollm3"
    tiny_model("smollm3_nope").save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    good = CliRunner().invoke(app, ["model", "check", str(model_dir), "--history-tokens", "120"])
    assert good.exit_code == 0, good.output
    assert "FAIL" not in good.stdout and good.stdout.count("PASS") == 6 and "NoPE), left unmoved: [1, 3]" in good.stdout
    monkeypatch.setattr(geometry, "nope_layers", lambda model: frozenset())  # what relaylens did before
    bad = CliRunner().invoke(app, ["model", "check", str(model_dir), "--history-tokens", "120"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert any(line.startswith("FAIL") and "model's own keys" in line for line in bad.stdout.splitlines())
    assert "exactness check(s)" in bad.stderr
