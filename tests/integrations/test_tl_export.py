"""The interpretability exports: TransformerLens's ActivationCache of the relocated question pass agrees with
relaylens's own probe recorder, the CircuitsVis export follows the condition's coordinates and CircuitsVis accepts
it."""

from __future__ import annotations

import json

import pytest
import torch

from relaylens.errors import RelaylensError
from relaylens.geometry.selection import Selection
from relaylens.integrations.tl_export import record_activations, relay_activations
from relaylens.model.prefill import prefill_history
from relaylens.probes.readouts import probe_condition
from relaylens.probes.transformer_lens import bridge_model
from relaylens.testing import tiny_model, tiny_tokenizer

pytest.importorskip("transformer_lens.model_bridge")

L, Q = 48, 5


@pytest.fixture(scope="module")
def setup():
    """Tiny Llama, a prefill, a ragged selection (heads keep 3 to 9 states), a question, evidence at 10..14."""
    model = tiny_model("llama")
    gen = torch.Generator().manual_seed(0)
    history = torch.randint(3, model.config.vocab_size, (L,), generator=gen)
    question = torch.randint(3, model.config.vocab_size, (Q,), generator=gen)
    prefill = prefill_history(model, history, window_size=8)
    keep = [[[1, 4, 10, 12, 20, 33, 40, 45, 47], [0, 11, 47]], [[2, 13, 30, 47], [5, 6, 7, 14, 46, 47]]]
    selection = Selection.from_lists(keep, L)
    evidence = torch.zeros(L, dtype=torch.bool)
    evidence[10:15] = True
    return model, bridge_model(model), prefill, selection, question, evidence


@pytest.mark.parametrize("condition", ["original", "relay", "reverse_order"])
def test_cache_attention_equals_relaylens_probes(setup, condition):
    model, bridge, prefill, selection, question, evidence = setup
    run = relay_activations(bridge, prefill, selection, condition, question, evidence)
    probed = probe_condition(model, prefill, selection, condition, question, evidence, max_new_tokens=0)
    recorder = probed.question_recorder
    assert run.question_positions.tolist() == probed.generation.question_positions.tolist()
    for layer in range(selection.num_layers):
        ours = run.final_attention(layer)
        assert ours.shape == recorder.rows[layer].shape  # [q_head, history slots + Q]
        torch.testing.assert_close(ours, recorder.rows[layer], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(run.logits[-1], probed.generation.last_logits, atol=1e-4, rtol=1e-4)
    assert run.cache["blocks.0.attn.hook_rot_q"].shape[1] == Q and len(run.cache.keys()) > 50


def test_export_labels_follow_the_condition(setup):
    _, bridge, prefill, selection, question, evidence = setup
    relay = relay_activations(bridge, prefill, selection, "relay", question, evidence)
    view = relay.attention_export(layer=0, kv_head=1)  # keeps [0, 11, 47]; M = 9
    assert view.source_positions == [0, 11, 47] and view.new_positions == [6, 7, 8]
    assert view.labels[1].endswith("11 -> 7 ★") and view.evidence == [False, True, False]
    assert view.q_heads == [2, 3] and view.question_position == 9 + Q - 1
    for row, share in zip(view.attention, view.question_share):
        assert abs(sum(row) + share - 1.0) < 1e-4
    reverse = relay_activations(bridge, prefill, selection, "reverse_order", question, evidence).attention_export(0, 1)
    assert reverse.new_positions == [6, 7, 8] and reverse.source_positions == [47, 11, 0]  # slots by new position
    original = relay_activations(bridge, prefill, selection, "original", question, evidence).attention_export(0, 1)
    assert original.new_positions == [0, 11, 47] and original.question_position == L + Q - 1
    data = json.loads(view.to_json())
    assert data["labels"] == view.labels and data["attention"] == view.attention


def test_circuitsvis_accepts_the_export(setup):
    circuitsvis = pytest.importorskip("circuitsvis")
    from circuitsvis.attention import attention_heads, attention_pattern
    from circuitsvis.tokens import colored_tokens, colored_tokens_multi

    _, bridge, prefill, selection, question, evidence = setup
    view = relay_activations(bridge, prefill, selection, "relay", question, evidence).attention_export(1, 0)
    pattern = view.attention_pattern()
    assert len(pattern["attention"]) == len(pattern["tokens"]) == len(view.labels) + 1
    for function, kwargs in [(colored_tokens, view.colored_tokens()),
                             (colored_tokens_multi, view.colored_tokens_multi()),
                             (attention_pattern, pattern), (attention_heads, view.attention_heads()),
                             (colored_tokens, view.colored_tokens(head=view.q_heads[-1]))]:
        html = function(**kwargs).local_src  # the offline bundle; no network probe
        assert json.dumps(view.labels[0]) in html and "unpkg.com" not in html, circuitsvis.__version__


def test_record_activations_on_a_generated_record(tmp_path):
    from relaylens.datasets import load_records
    from relaylens.datasets.synthetic import generate_records

    data = tmp_path / "records.json"
    data.write_text(json.dumps(generate_records(n=1, seed=0, history_tokens=800)))
    record = load_records(data)[0]
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    run = record_activations(model, tokenizer, record, selector="snapkv", budget=0.1, condition="relay")
    view = run.attention_export(layer=1, kv_head=0)
    assert run.question_positions[0].item() == run.selection.max_count
    assert run.evidence.shape == run.selection.valid.shape and len(view.labels) == int(run.selection.counts[1, 0])
    assert all(" -> " in label for label in view.labels)


def test_bad_input_is_refused_before_model_work(setup):
    model, bridge, prefill, selection, question, evidence = setup
    with pytest.raises(RelaylensError, match="question has no tokens"):
        relay_activations(bridge, prefill, selection, "relay", torch.tensor([], dtype=torch.long), evidence)
    with pytest.raises(RelaylensError, match="evidence mask covers 3 tokens but the history has 48"):
        relay_activations(bridge, prefill, selection, "relay", question, torch.ones(3, dtype=torch.bool))
    run = relay_activations(bridge, prefill, selection, "relay", question, evidence)
    with pytest.raises(RelaylensError, match="outside the model"):
        run.attention_export(layer=5)
    with pytest.raises(RelaylensError, match="does not read kv head 0"):
        run.attention_export(0, 0).weights(head=3)
    patterns_only = relay_activations(bridge, prefill, selection, "relay", question, evidence,
                                      names_filter=lambda name: name.endswith("hook_pattern"))
    assert patterns_only.attention_export(1, 1).new_positions == [3, 4, 5, 6, 7, 8]
    rot_q_only = relay_activations(bridge, prefill, selection, "relay", question, evidence,
                                   names_filter=lambda name: name.endswith("hook_rot_q"))
    with pytest.raises(RelaylensError, match="names_filter left it out"):
        rot_q_only.attention_export(0)
    with pytest.raises(RelaylensError, match="needs the Hugging Face model"):
        record_activations(bridge, tiny_tokenizer(), None)
