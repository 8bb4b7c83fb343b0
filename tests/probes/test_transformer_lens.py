"""TransformerLens backend (b) against the default backend (a): same readouts; the cache= shim's effect and scope."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from relaylens.errors import RelaylensError
from relaylens.generation.single import build_cache, prefill_from_cache
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.probes import transformer_lens as probes_tl
from relaylens.probes.readouts import probe_condition, replay_conditions
from relaylens.probes.transformer_lens import (
    bridge_model,
    cache_kwarg_shim,
    probe_condition_tl,
    ragged_attention_config,
    shim_needed,
    update_reads_cache_kwarg,
)
from relaylens.testing import tiny_model

pytest.importorskip("transformer_lens.model_bridge")
from support.probes_tl_shared import KEYS, disagreement  # noqa: F401 - shared with the model tier
from transformer_lens.model_bridge.generalized_components.attention import (
    AttentionBridge,  # noqa: E402
)

L, Q = 48, 5


def _setup(variant="llama", seed=0):
    """Tiny model, its prefill, a ragged per-(layer, kv_head) random selection, a question and an evidence span."""
    model = tiny_model(variant, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    history = torch.randint(3, model.config.vocab_size, (L,), generator=gen)
    question = torch.randint(3, model.config.vocab_size, (Q,), generator=gen)
    with torch.no_grad():
        out = model(history[None], use_cache=True, cache=DynamicCache())
    pre = prefill_from_cache(history, out.cache, model)
    keep = [[sorted(torch.randperm(L, generator=gen)[: 10 + 3 * h + 2 * l].tolist()) for h in range(pre.num_kv_heads)]
            for l in range(pre.num_layers)]
    evidence = torch.zeros(L, dtype=torch.bool)
    evidence[10:22] = True
    return model, pre, Selection.from_lists(keep, L), question, evidence


@pytest.fixture(scope="module")
def tiny():
    model, pre, sel, question, evidence = _setup()
    return model, bridge_model(model), pre, sel, question, evidence


# ------------------------------------------------------------------------------------------------------------
# agreement


@pytest.mark.parametrize("condition", ["original", "relay", "half_gap", "score_order"])
def test_backends_agree_on_tiny_model(tiny, condition):
    model, bridge, pre, sel, question, evidence = tiny
    if condition == "score_order":
        sel = Selection(sel.positions, sel.valid, sel.history_length, scores=torch.rand(sel.positions.shape))
    a = probe_condition(model, pre, sel, condition, question, evidence, max_new_tokens=0, teacher_token=7)
    b = probe_condition_tl(bridge, pre, sel, condition, question, evidence, teacher_token=7)
    assert set(b.readouts.probe_point) == {"question_final", "first_answer_token"}
    assert disagreement(a.readouts, b.readouts) <= 1e-6
    assert torch.allclose(a.generation.last_logits, b.generation.last_logits, atol=1e-5)
    for layer in a.question_recorder.rows:  # the hook data themselves, not only their reductions
        assert torch.allclose(a.question_recorder.rows[layer], b.question_recorder.rows[layer], atol=1e-6)
        assert torch.allclose(a.question_recorder.queries[layer], b.question_recorder.queries[layer], atol=1e-5)


def test_backends_agree_with_sliding_windows_on_relocated_coordinates(monkeypatch):
    """Gemma-3: windows measured on the condition's positions are applied in the hook, as in the attention function."""
    model, pre, sel, question, evidence = _setup("gemma3", seed=1)
    bridge = bridge_model(model)
    assert probes_tl._sliding_windows(bridge) == {0: 8, 1: 8}
    for condition in ("relay", "original"):
        a = probe_condition(model, pre, sel, condition, question, evidence, max_new_tokens=0)
        b = probe_condition_tl(bridge, pre, sel, condition, question, evidence)
        assert disagreement(a.readouts, b.readouts) <= 1e-6, condition
    monkeypatch.setattr(probes_tl, "_sliding_windows", lambda bridge: {})  # without the hook's windows it differs
    b = probe_condition_tl(bridge, pre, sel, "original", question, evidence)
    assert disagreement(a.readouts, b.readouts) > 1e-3


def test_agreement_is_not_vacuous(tiny):
    """The comparison can fail: other conditions and a model that differs in one layer give other readouts."""
    model, bridge, pre, sel, question, evidence = tiny
    a = probe_condition(model, pre, sel, "original", question, evidence, max_new_tokens=0)
    b = probe_condition_tl(bridge, pre, sel, "relay", question, evidence)
    assert disagreement(a.readouts, b.readouts) > 1e-3
    other = bridge_model(tiny_model("llama", seed=9))
    c = probe_condition_tl(other, pre, sel, "original", question, evidence)
    assert disagreement(a.readouts, c.readouts) > 1e-3


def test_phase_replay_from_either_backend_is_the_same(tiny):
    model, bridge, pre, sel, question, evidence = tiny
    factors = RotaryFactors.from_model(model)
    ref_a = probe_condition(model, pre, sel, "original", question, evidence, factors=factors, max_new_tokens=0)
    ref_b = probe_condition_tl(bridge, pre, sel, "original", question, evidence)
    rep_a = replay_conditions(ref_a, pre, sel, evidence, ["original", "relay"], Q, factors)
    rep_b = replay_conditions(ref_b, pre, sel, evidence, ["original", "relay"], Q, factors)
    merged = rep_a.merge(rep_b, on=KEYS + ["condition"])
    assert len(merged) == len(rep_a)
    assert np.allclose(merged.value_x, merged.value_y, atol=1e-5, equal_nan=True)


def test_wrapping_leaves_the_hf_model_and_configs_untouched(tiny):
    model, bridge, pre, sel, question, evidence = tiny
    assert type(model.model.layers[0].self_attn).__name__ == "LlamaAttention"
    assert bridge.original_model is not model and model.config._attn_implementation == "sdpa"
    previous = bridge.original_model.config._attn_implementation
    probe_condition_tl(bridge, pre, sel, "relay", question, evidence)
    assert bridge.original_model.config._attn_implementation == previous
    assert AttentionBridge.__dict__["_update_kv_cache"].__name__ == "_update_kv_cache"
    assert not hasattr(AttentionBridge.__dict__["_update_kv_cache"], "relaylens_shim")


def test_record_without_evidence_raises(tiny):
    model, bridge, pre, sel, question, _ = tiny
    with pytest.raises(RelaylensError, match="no gold evidence"):
        probe_condition_tl(bridge, pre, sel, "relay", question, torch.zeros(L, dtype=torch.bool))


# ------------------------------------------------------------------------------------------------------------
# the cache= shim


def _uniform_cache_pass(model, bridge, pre, question, shim):
    """Question pass over a full (uniform) cache: HF reference logits, bridge logits, and the bridge cache's length."""
    sel = Selection.full(L, pre.num_layers, pre.num_kv_heads)
    factors = RotaryFactors.from_model(model)
    positions = torch.arange(L, L + Q)[None]
    with torch.no_grad():
        reference = model(question[None], position_ids=positions,
                          cache=build_cache(pre, sel, "original", factors).cache).logits[0]
        cache = build_cache(pre, sel, "original", factors).cache
        with cache_kwarg_shim(shim), ragged_attention_config(bridge):
            logits = bridge(question[None], return_type="logits", position_ids=positions, cache=cache,
                            use_cache=True)[0]
    return reference, logits, cache.get_seq_length()


def test_installed_transformer_lens_ignores_cache_kwarg_and_shim_is_needed():
    assert not update_reads_cache_kwarg()
    assert shim_needed()


def test_without_shim_the_cached_bridge_pass_is_silently_wrong(tiny):
    model, bridge, pre, sel, question, evidence = tiny
    reference, logits, length = _uniform_cache_pass(model, bridge, pre, question, shim=False)
    assert length == L  # the question was never appended: the bridge read no history at all
    assert (reference - logits).abs().max() > 0.1  # ...and nothing raised
    reference, logits, length = _uniform_cache_pass(model, bridge, pre, question, shim=None)
    assert length == L + Q
    assert (reference - logits).abs().max() <= 1e-5


def test_probe_refuses_a_pass_that_ignored_the_cache(tiny):
    model, bridge, pre, sel, question, evidence = tiny
    with pytest.raises(RelaylensError, match="cache_kwarg_shim"):
        probe_condition_tl(bridge, pre, sel, "relay", question, evidence, shim=False)


def test_shim_is_scoped_and_restored_even_on_error():
    original = AttentionBridge.__dict__["_update_kv_cache"]
    with cache_kwarg_shim() as active:
        assert active
        patched = AttentionBridge.__dict__["_update_kv_cache"]
        assert patched is not original and patched.relaylens_shim
        assert update_reads_cache_kwarg()
        with cache_kwarg_shim() as nested:  # already reads cache=: the inner block patches nothing
            assert not nested and AttentionBridge.__dict__["_update_kv_cache"] is patched
        assert AttentionBridge.__dict__["_update_kv_cache"] is patched
    assert AttentionBridge.__dict__["_update_kv_cache"] is original
    with pytest.raises(ZeroDivisionError):
        with cache_kwarg_shim():
            1 / 0
    assert AttentionBridge.__dict__["_update_kv_cache"] is original
    assert not update_reads_cache_kwarg()


def test_shim_switches_itself_off_when_transformer_lens_reads_cache(tiny, monkeypatch):
    """Simulate a fixed TransformerLens: the method reads cache= itself, so the shim must not patch anything."""
    model, bridge, pre, sel, question, evidence = tiny
    shipped = AttentionBridge.__dict__["_update_kv_cache"]

    def fixed(self, k, v, **kwargs):
        caches = [kwargs.get(name) for name in ("past_key_values", "cache", "layer_past")]
        cache = next((c for c in caches if c is not None), None)
        return (k, v) if cache is None else cache.update(k, v, self._layer_idx)

    monkeypatch.setattr(AttentionBridge, "_update_kv_cache", fixed)
    assert not shim_needed()
    with cache_kwarg_shim() as active:
        assert not active and AttentionBridge.__dict__["_update_kv_cache"] is fixed
    reference, logits, length = _uniform_cache_pass(model, bridge, pre, question, shim=None)
    assert length == L + Q and (reference - logits).abs().max() <= 1e-5
    a = probe_condition(model, pre, sel, "relay", question, evidence, max_new_tokens=0)
    b = probe_condition_tl(bridge, pre, sel, "relay", question, evidence)
    assert disagreement(a.readouts, b.readouts) <= 1e-6
    monkeypatch.undo()
    assert AttentionBridge.__dict__["_update_kv_cache"] is shipped


def test_shim_stays_off_with_a_warning_when_the_method_cannot_be_probed(monkeypatch):
    monkeypatch.setattr(AttentionBridge, "_update_kv_cache", lambda self, k, v, layer_idx: (k, v))
    with pytest.warns(RuntimeWarning, match="cannot probe"):
        assert not shim_needed()


# ------------------------------------------------------------------------------------------------------------
# the real model on a real record


def test_module_docstring_example_runs():
    import doctest

    result = doctest.testmod(probes_tl, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
