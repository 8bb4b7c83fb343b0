"""LoCoMo's own QA scoring (snap-research/locomo ``task_eval/evaluation.py``, ``eval_question_answering``), rule for
rule, beside relaylens's ``contains``.

* **Normalisation** (LoCoMo's ``normalize_answer``): commas removed, lower case, ASCII punctuation removed, the words
  a / an / the / **and** removed, whitespace collapsed. Tokens are then Porter-stemmed with NLTK's
  ``PorterStemmer()`` (its default mode, as upstream).
* **Token F1** (``f1_score``): SQuAD-style F1 over the stemmed tokens; no shared token is 0.
* **Per category** (LoCoMo's ``category``; names in :data:`relaylens.datasets.locomo.CATEGORIES`):

  - 2 temporal, 4 single-hop: token F1 against the answer;
  - 3 open-domain: token F1 against the part of the answer before its first ``;``;
  - 1 multi-hop: the prediction and the answer are split on ``,``; each answer part takes its best F1 over the
    prediction parts; the mean over the answer parts (``f1``);
  - 5 adversarial: 1 when the lower-cased output contains ``no information available`` or ``not mentioned``, else 0.

The score of a LoCoMo record is the ``locomo_f1`` metric of :func:`relaylens.scoring.metrics.score_answer` (LoCoMo
records only: ``source == "locomo"``); ``contains`` and the other metrics stay relaylens's own.

Example:
    >>> locomo_normalize("The cat, and a Dog!")
    'cat dog'
    >>> locomo_token_f1("running dogs", "the dog runs")
    1.0
    >>> locomo_score("Paris, Rome", "Rome, Berlin", 1)
    0.5
    >>> locomo_score("It is not mentioned in the conversation.", "self-care is important", 5)
    1.0
"""

from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache

from relaylens.errors import RecordError

__all__ = ["locomo_normalize", "locomo_token_f1", "locomo_multi_f1", "locomo_adversarial", "locomo_score"]

_ARTICLES_AND = re.compile(r"\b(a|an|the|and)\b")
_PUNCT = set(string.punctuation)
ADVERSARIAL_PHRASES = ("no information available", "not mentioned")
"""Category 5: an output containing one of these (lower-cased) scores 1."""


def locomo_normalize(text) -> str:
    """LoCoMo's answer normalisation: commas, case, punctuation, a / an / the / and, spacing.

    >>> locomo_normalize("7 May, 2023."), locomo_normalize("Salt and pepper")
    ('7 may 2023', 'salt pepper')
    """
    s = str(text).replace(",", "").lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    return " ".join(_ARTICLES_AND.sub(" ", s).split())


@lru_cache(maxsize=1)
def _stemmer():
    try:
        from nltk.stem import PorterStemmer  # noqa: PLC0415 - loaded on first use: only LoCoMo records need it
    except ImportError:
        raise ImportError("LoCoMo's F1 Porter-stems its tokens with NLTK's PorterStemmer, as LoCoMo's "
                          "task_eval/evaluation.py does; expected the nltk package, found none. Fix: pip install "
                          "'nltk>=3.8' (a relaylens dependency; no NLTK data download is needed)") from None
    return PorterStemmer()


@lru_cache(maxsize=1 << 16)
def _stem(word: str) -> str:
    return _stemmer().stem(word)


def _tokens(text) -> list[str]:
    return [_stem(w) for w in locomo_normalize(text).split()]


def locomo_token_f1(prediction, answer) -> float:
    """LoCoMo's ``f1_score``: token F1 of the normalised, stemmed prediction against one answer.

    >>> locomo_token_f1("May 2023", "7 May 2023"), locomo_token_f1("", "x")
    (0.8, 0.0)
    """
    pred, gold = _tokens(prediction), _tokens(answer)
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def locomo_multi_f1(prediction, answer) -> float:
    """LoCoMo's multi-answer ``f1`` (category 1): mean over the answer's ``,`` parts of the best F1 over the
    prediction's ``,`` parts.

    >>> round(locomo_multi_f1("painting, pottery", "pottery, painting, camping"), 4)
    0.6667
    """
    predictions = [p.strip() for p in str(prediction).split(",")]
    answers = [a.strip() for a in str(answer).split(",")]
    return sum(max(locomo_token_f1(p, a) for p in predictions) for a in answers) / len(answers)


def locomo_adversarial(prediction) -> float:
    """Category 5: 1.0 when the output says ``no information available`` or ``not mentioned``, else 0.0."""
    text = str(prediction).lower()
    return float(any(phrase in text for phrase in ADVERSARIAL_PHRASES))


def locomo_score(prediction, answer, category: int) -> float:
    """LoCoMo's QA score of one output for a question of ``category`` (1-5; see the module docstring).

    >>> locomo_score("Dr. Seuss books; likely", "Yes; since she collects classic children's books", 3)
    0.0
    >>> locomo_score("7 May 2023", 2023, 2)
    0.5
    """
    answer = str(answer)
    if category == 3:
        answer = answer.split(";")[0].strip()
    if category in (2, 3, 4):
        return locomo_token_f1(prediction, answer)
    if category == 1:
        return locomo_multi_f1(prediction, answer)
    if category == 5:
        return locomo_adversarial(prediction)
    raise RecordError(f"LoCoMo scores categories 1-5; got category {category!r}. Fix: pass the question's LoCoMo "
                      "category (record.meta['category'])")
