"""Real-model tier of test_prompting.py: prompt rendering: exact joint tokenisation, unit spans over the right
tokens, no gold leaks, both modes."""

from __future__ import annotations

import pytest
import torch
from support.prompting_shared import MODES, tok_fixture  # noqa: F401 - pytest fixture (named tok)

from relaylens.datasets import load_records
from relaylens.datasets.prompting import (
    render_prompt,
)

pytestmark = pytest.mark.model


@pytest.mark.model
def test_real_smollm2_tokenizer_round_trip():
    """The embedded model's tokenizer and chat template (skipped until `relaylens model pull` has run)."""
    models = pytest.importorskip("relaylens.model.embedded")
    if not models.is_pulled(models.DEFAULT_MODEL):
        pytest.skip("embedded SmolLM2 not pulled")
    from relaylens.datasets.synthetic import bundled_sample_path
    from relaylens.model.loading import load_tokenizer

    tok = load_tokenizer(models.DEFAULT_MODEL)
    for rec in load_records(bundled_sample_path())[:7]:
        for mode in MODES:
            p = render_prompt(rec, tok, mode=mode)
            ids = torch.cat([p.history_ids, p.question_ids]).tolist()
            assert tok(p.history_text + p.question_text, add_special_tokens=False)["input_ids"] == ids
            assert tok.decode(ids) == p.history_text + p.question_text
            for t in p.turns:
                if t.is_evidence:
                    assert t.text in tok.decode(p.history_ids[t.start : t.end].tolist())
