"""Real-model tier of test_prefill.py: history prefill on tiny random models (every rope variant) and on the
embedded SmolLM2 (``-m model``)."""

from __future__ import annotations

import pytest
import torch
from support.prefill_shared import eager_rows, rows_from_queries  # noqa: F401 - shared with the model tier

from relaylens.model.prefill import prefill_history

pytestmark = pytest.mark.model


@pytest.mark.model
def test_smollm2_prefill_cache_equals_plain_forward(smollm2):
    model, tok = smollm2
    text = "User: I adopted a Vizsla called Biscuit last spring and we walk by the river every morning.\n" * 60
    ids = torch.tensor(tok(text)["input_ids"][:1000])  # [1000]
    assert ids.numel() == 1000
    res = prefill_history(model, ids, window_size=32, chunk_size=500)  # two chunks
    with torch.inference_mode():
        out = model(ids[None], use_cache=True, logits_to_keep=1)
    for layer, (k, v) in enumerate(zip(res.keys, res.values)):
        torch.testing.assert_close(k, out.past_key_values.layers[layer].keys[0], rtol=0, atol=1e-4)
        torch.testing.assert_close(v, out.past_key_values.layers[layer].values[0], rtol=0, atol=1e-4)
    assert res.keys[0].shape == (3, 1000, 64) and res.window_queries[0].shape == (9, 32, 64)
    assert res.scaling == 64**-0.5 and res.num_key_value_groups == 3


@pytest.mark.model
def test_smollm2_window_queries_reproduce_eager_rows(smollm2):
    model, tok = smollm2
    ids = torch.tensor(tok("Session 1: my dog Biscuit likes the river. " * 30)["input_ids"][:200])  # [200]
    res = prefill_history(model, ids, window_size=16)
    real = eager_rows(model, ids)
    n = res.history_length
    for layer in (0, 14, 29):
        torch.testing.assert_close(rows_from_queries(res, layer, None), real[layer][:, n - 16:], rtol=0, atol=1e-5)
