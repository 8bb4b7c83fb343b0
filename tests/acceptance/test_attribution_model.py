"""Real-model tier of test_attribution.py: the differentiable path and evidence attribution, against finite
differences and independent forward passes."""

from __future__ import annotations

import pytest
from support.attribution_shared import check_logit_attribution, o_proj_row  # noqa: F401 - shared with the model tier

pytestmark = pytest.mark.model


@pytest.mark.slow
@pytest.mark.model
def test_logit_attribution_on_smollm2(smollm2):
    """SmolLM2, bundled record, bm25 at 0.2: DLA = linearised logit change of zeroing gold values, within 1e-3 relative
    (observed: relative differences of about 1e-5 in float32, DLA values 1e-3 to 2e-2 logits)."""
    from relaylens.datasets import load_records, resolve_data
    from relaylens.datasets.prompting import render_prompt
    from relaylens.experiments.walk import answer_tokens
    from relaylens.model.prefill import prefill_history
    from relaylens.selectors import make_selector

    model, tokenizer = smollm2
    record = next(r for r in load_records(resolve_data("sample")) if r.answers and not r.is_abstention)
    prompt = render_prompt(record, tokenizer, mode="completion")
    pre = prefill_history(model, prompt.history_ids, window_size=32)
    sel = make_selector("bm25").select(pre, prompt, 0.2)
    target = answer_tokens(tokenizer, record, "completion")[0]
    layers = [0, pre.num_layers // 2, pre.num_layers - 1]
    pairs, _ = check_logit_attribution(model, pre, sel, prompt.question_ids, prompt.evidence_mask("turn"), "relay",
                                       target, layers)
    for layer, (attributed, predicted) in pairs.items():
        assert attributed == pytest.approx(predicted, rel=1e-3, abs=1e-4), (layer, attributed, predicted)
    assert any(abs(a) > 1e-3 for a, _ in pairs.values())
