"""Metrics that carry a benchmark's name equal that benchmark's own scoring code.

The references below restate, independently, the logic of SQuAD v1.1's ``evaluate-v1.1.py`` (normalisation,
exact match, token F1; InfiniteBench's ``compute_scores.py`` repeats it for En.QA) and of InfiniteBench's
``get_score_one_longbook_choice_eng`` / ``get_score_one_longdialogue_qa_eng`` (OpenBMB/InfiniteBench, ``src/``).
relaylens's richer normalisation (``numbers=True``) is tested as relaylens's own rule in ``test_metrics.py``.
"""

from __future__ import annotations

import collections
import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relaylens.scoring.metrics import (
    exact_match,
    f1,
    infinitebench_choice_correct,
    infinitebench_dialogue_correct,
    normalize_answer,
    score_answer,
)


def ref_normalize(text: str) -> str:
    lowered = text.lower()
    kept = "".join(ch for ch in lowered if ch not in set(string.punctuation))
    no_articles = re.sub(r"\b(a|an|the)\b", " ", kept)
    return " ".join(no_articles.split())


def ref_f1(prediction: str, truths: list[str]) -> float:
    best = 0.0
    for truth in truths:
        p, g = ref_normalize(prediction).split(), ref_normalize(truth).split()
        same = sum((collections.Counter(p) & collections.Counter(g)).values())
        if same:
            precision, recall = same / len(p), same / len(g)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def ref_em(prediction: str, truths: list[str]) -> float:
    return float(any(ref_normalize(prediction) == ref_normalize(t) for t in truths))


def ref_choice(pred: str, label: list[str]) -> bool:
    pred = pred.strip()
    if pred == "":
        return False
    if pred[0] in "ABCD":
        return pred[0] in label
    if pred in label:
        return True
    for c in "\n\"'.,?!{}":
        pred = pred.replace(c, " ")
    while "  " in pred:
        pred = pred.replace("  ", " ")
    for prefix in ("answer is:", "answer:", "answer is", "option is"):
        at = pred.find(prefix)
        if at < 0:
            continue
        if len(pred) < at + len(prefix) + 1:
            return False
        rest = pred[at + len(prefix) + 1:]
        return any(rest.startswith(s) for s in label)
    for word in pred.split():
        if word in "ABCD":
            return word in label
    return False


def ref_dialogue(pred: str, label: str) -> bool:
    pred = pred.strip()
    for c in "\n:\"'.,?!{}":
        pred = pred.replace(c, " ")
    return label in [w.upper() for w in pred.split()]


TRICKY = ["", "the", "A", "a", "an apple", "Don\u2019t", "don't", "dont", "U.S.A.", "  The   Cat! ", "\u2019",
          "it\u2019s",
          "three", "3", "1,200", "3.0", "the the", "cat cat dog", "Biscuit the Vizsla", "ÉCOLE", "x\ty", "a-b", "’tis"]


@pytest.mark.parametrize("pred", TRICKY)
@pytest.mark.parametrize("truth", TRICKY[:12])
def test_squad_metrics_equal_the_official_script(pred, truth):
    if not truth.strip():
        return
    assert normalize_answer(pred) == ref_normalize(pred)
    assert f1(pred, [truth], numbers=False) == pytest.approx(ref_f1(pred, [truth]))
    assert exact_match(pred, [truth], numbers=False) == ref_em(pred, [truth])


def test_the_issue_examples():
    assert f1("A", ["a"], numbers=False) == 0.0 and f1("", ["the"], numbers=False) == 0.0
    assert f1("Don\u2019t", ["don't"], numbers=False) == 0.0, "U+2019 is not punctuation in SQuAD v1.1"
    qa = {"answers": ["don't"], "question_type": "longbook_qa_eng", "source": "infinitebench"}
    assert score_answer(qa, "Don\u2019t")["f1"] == 0.0 == ref_f1("Don\u2019t", ["don't"])
    assert score_answer({"answers": ["don't"]}, "Don\u2019t")["f1"] == 1.0, "relaylens's own normalisation folds it"


def pieces(*parts, max_size: int = 30):
    """Strings glued from ``parts`` (single characters and whole words)."""
    return st.lists(st.sampled_from([p for part in parts for p in part]), max_size=max_size).map("".join)


TEXT = pieces(list("abAB the,.'’!?-\t\n"), ["an", "The", "A ", "’s"])


@settings(max_examples=300, deadline=None)
@given(TEXT, st.lists(TEXT, min_size=1, max_size=3))
def test_en_qa_f1_is_the_official_f1(pred, truths):
    assert normalize_answer(pred) == ref_normalize(pred)
    assert f1(pred, truths, numbers=False) == pytest.approx(ref_f1(pred, truths))
    record = {"answers": truths, "question_type": "longbook_qa_eng", "source": "infinitebench"}
    assert score_answer(record, pred)["f1"] == pytest.approx(ref_f1(pred, truths))


CHOICES = ["The CD was in the drawer, so B", "The AB test says B", "Maybe BC or B", "I pick ABCD", "B", "b",
           "The answer is: B", "The answer is B", "the answer is b", "answer:", "answer: ", "answer:  B",
           "answer:\t\tB", "The option is The dog", "Cats and B", "The dog", "  B  ", "So, D", "I think B.",
           "Not A, it is B", "(B)", "Answer: B", "The answer is\nB", "none", ""]


@pytest.mark.parametrize("answer", CHOICES)
@pytest.mark.parametrize("option, letter", [("The dog", "B"), ("The dog", "b"), ("", "B")])
def test_en_mc_choice_equals_the_official_rule(answer, option, letter):
    assert infinitebench_choice_correct(answer, option, letter) is ref_choice(answer, [option, letter.upper()])


@settings(max_examples=300, deadline=None)
@given(pieces(list("ABCDabcd .,:\n\t'\""), ["answer is", "answer:", "option is", "CD", "The dog"], max_size=25))
def test_en_mc_choice_property(answer):
    assert infinitebench_choice_correct(answer, "The dog", "B") is ref_choice(answer, ["The dog", "B"])
    record = {"answers": ["The dog"], "options": ["x", "The dog", "y", "z"], "correct_option": "b",
              "question_type": "longbook_choice_eng", "source": "infinitebench"}
    assert score_answer(record, answer)["choice_accuracy"] == float(ref_choice(answer, ["The dog", "B"]))


@pytest.mark.parametrize("answer, label", [("It was john.", "JOHN"), ("john", "John"), ("THE BRIDE", "THE BRIDE"),
                                           ("{JOHN}", "JOHN"), ("Johnny", "JOHN"), ("", "JOHN")])
def test_en_dia_equals_the_official_rule(answer, label):
    assert infinitebench_dialogue_correct(answer, label) is ref_dialogue(answer, label)
