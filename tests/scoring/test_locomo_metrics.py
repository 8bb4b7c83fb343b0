"""LoCoMo's own QA scoring against values computed by hand from its evaluation.py, and the score_answer hook."""

from __future__ import annotations

import pytest

from relaylens.scoring.locomo import (
    locomo_adversarial,
    locomo_multi_f1,
    locomo_normalize,
    locomo_score,
    locomo_token_f1,
)
from relaylens.scoring.metrics import f1, score_answer


def test_normalisation_drops_commas_punctuation_articles_and_and():
    assert locomo_normalize("The Cat, and a Dog!") == "cat dog"
    assert locomo_normalize("1,200 apples.") == "1200 apples"  # the comma goes first: digits join
    assert locomo_normalize("Band and sand") == "band sand"  # "and" only as a word


def test_token_f1_stems_with_porter():
    # pred "he was running" -> [he, wa, run]; gold "runs" -> [run]: P = 1/3, R = 1, F1 = 0.5
    assert locomo_token_f1("He was running", "runs") == pytest.approx(0.5)
    assert locomo_token_f1("dogs", "dog") == 1.0 and f1("dogs", ["dog"]) == 0.0  # relaylens's F1 has no stemming
    assert locomo_token_f1("salt and pepper", "pepper, salt") == 1.0
    assert locomo_token_f1("", "Paris") == 0.0 and locomo_token_f1("the", "a") == 0.0
    # pred [went, to, pari, in, may] vs gold [pari]: P = 1/5, R = 1 -> 2 * 0.2 / 1.2
    assert locomo_token_f1("Went to Paris in May", "Paris") == pytest.approx(1 / 3)


def test_category_rules():
    # category 1: answer parts hiking / painting / swimming, best over prediction parts: 1, 1, 0 -> 2/3
    assert locomo_score("hiking, painting", "painting, swimming, hiking", 1) == pytest.approx(2 / 3)
    assert locomo_multi_f1("painting", "painting, hiking") == pytest.approx(0.5)
    # category 3: only the answer's part before ';' counts: "likely yes" vs "yes" -> P 1, R 1/2, F1 2/3
    assert locomo_score("yes", "Likely yes; she grows tulips", 3) == pytest.approx(2 / 3)
    assert locomo_score("yes", "Likely yes; she grows tulips", 4) == pytest.approx(2 / 6)  # whole answer for 4
    # categories 2 and 4: plain token F1; numbers as text
    assert locomo_score("In 2022", 2022, 2) == pytest.approx(2 / 3)
    # category 5: the phrases, case-insensitively; other abstentions do not count
    assert locomo_score("That is Not Mentioned in the conversation.", "Pixel", 5) == 1.0
    assert locomo_adversarial("No information available.") == 1.0
    assert locomo_adversarial("I don't know.") == 0.0 and locomo_adversarial("Pixel") == 0.0
    with pytest.raises(ValueError, match="categories 1-5"):
        locomo_score("x", "y", 6)


def test_score_answer_adds_locomo_f1_for_locomo_records_only():
    record = {"answers": ["hiking, painting"], "source": "locomo", "meta": {"category": 1}, "record_id": "c:q0"}
    out = score_answer(record, "painting")
    assert out["locomo_f1"] == pytest.approx(0.5) and out["contains"] == 0.0
    assert "locomo_f1" not in score_answer({"answers": ["hiking"]}, "hiking")
    adversarial = {"answers": ["Pixel"], "source": "locomo", "category": 5, "is_abstention": True}
    out = score_answer(adversarial, "I don't know.")
    assert out["abstention"] == 1.0 and out["locomo_f1"] == 0.0  # relaylens abstains; LoCoMo's phrases are absent
    assert score_answer(adversarial, "Not mentioned.")["locomo_f1"] == 1.0
    with pytest.raises(ValueError, match="no category"):
        score_answer({"answers": ["x"], "source": "locomo", "record_id": "c:q1"}, "x")
