"""Answer scoring: SQuAD-normalised exact match / token F1 / containment, choice extraction, abstention detection.

Every metric is a float in {0, 1} (F1 in [0, 1]), maximised over the record's references. :func:`score_answer`
turns one (record, answer) into the ``metric -> value`` dict that fills the ``scores`` table
(:mod:`relaylens.results.tables`); the LLM judge lives in :mod:`relaylens.scoring.judge`.

Rules (decisions documented here, the dataset rules quoted from ``reference/datasets.md``):

* **Normalisation** (``numbers=False``: SQuAD v1.1's ``evaluate-v1.1.py``, which InfiniteBench's
  ``compute_scores.py`` repeats): lower case, drop ASCII punctuation (``string.punctuation``; the typographic
  apostrophe U+2019 is *not* punctuation there and stays), drop the articles a/an/the, collapse whitespace.
  InfiniteBench En.QA is scored this way, so its ``f1`` is the official metric.
* **relaylens normalisation** (``numbers=True``, the default for every other record; relaylens's own rule, not a
  benchmark's): U+2019 first becomes ``'`` (so it is dropped as punctuation), thousands separators are dropped
  (``1,200`` -> ``1200``), trailing zero decimals removed (``3.0`` -> ``3``), and the number words zero..ninety-nine
  become digits (``three`` -> ``3``, ``twenty-one`` / ``twenty one`` -> ``21``), in both the answer and the
  references; then the SQuAD steps. Hyphenated words other than tens-units (``one-off``) are left alone; hundreds,
  ordinals and "twice" are *not* converted.
* **F1** is SQuAD's token F1 in both normalisations: no shared token scores 0, so an answer and a reference that
  both normalise to nothing score 0 (``"A"`` vs ``"a"``), as in SQuAD v1.1 and InfiniteBench; exact match of two
  empty strings is 1, as there.
* **contains**: the normalised reference occurs as a whole-token run inside the normalised answer ("cat" is not
  contained in "category"). For InfiniteBench En.Dia it is the official rule (the label, as given, is one of the
  answer's upper-cased words).
* **choice_accuracy** (records with ``options``): PersonaMem -- letters ``(x)`` after the last ``<final_answer>``,
  else bare ``x`` words; correct iff the extracted set is exactly ``{correct}``; retried on the full response
  (case-insensitive, a documented leniency: models write ``(C)``). InfiniteBench En.MC -- the official
  ``compute_scores.py`` rule, step for step: first character A-D, exact option text, text after "answer is:"/
  "answer:"/"answer is"/"option is", else the first word that is a piece of "ABCD" decides (case-sensitive; a word
  such as "CD" or "AB" ends the scan unmatched, as upstream).
* **locomo_f1** (LoCoMo records, ``source == "locomo"``): LoCoMo's own per-category QA score
  (:mod:`relaylens.scoring.locomo`: stemmed token F1, the category-1 multi-answer and category-3 ``;`` rules, the
  category-5 "not mentioned" rule), beside relaylens's metrics.
* **abstention**: 1.0 when the answer says the information is unavailable (:func:`is_abstention`), for every
  record (on answerable records it measures false abstention). An abstention record (LongMemEval ``_abs``) is
  correct iff the answer abstains: its ``exact_match``, ``f1`` and ``contains`` equal its ``abstention`` value.

Example:
    >>> exact_match("The Biscuit!", ["biscuit"]), f1("my dog biscuit", ["Biscuit"])
    (1.0, 0.5)
    >>> contains("I went there three times.", ["3"])
    1.0
    >>> extract_choice_personamem("I pick <final_answer> (C)")
    {'c'}
    >>> is_abstention("You never mentioned a hamster, so I can't say.")
    True
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from relaylens import moved_name
from relaylens.errors import RecordError

__all__ = [
    "normalize_answer", "exact_match", "f1", "contains", "is_abstention", "extract_choice_personamem",
    "infinitebench_choice_correct", "infinitebench_dialogue_correct", "score_answer", "ANSWER_METRICS",
]

ANSWER_METRICS = ("exact_match", "f1", "contains", "choice_accuracy", "abstention", "locomo_f1")  # score_answer's
"""Metrics :func:`score_answer` can return (``choice_accuracy`` only for multiple-choice records, ``locomo_f1`` only
for LoCoMo records)."""

_NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                 "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_WORD_TO_DIGIT = {w: str(i) for i, w in enumerate(_NUMBER_WORDS)} | {w: str(20 + 10 * i) for i, w in enumerate(_TENS)}
_TENS_RE = re.compile(r"(?<![\w-])(" + "|".join(_TENS) + r")(?:[- ](" + "|".join(_NUMBER_WORDS[1:10]) + r"))?(?![\w-])")
_NUMBER_WORD_RE = re.compile(r"(?<![\w-])(" + "|".join(_NUMBER_WORDS) + r")(?![\w-])")
_THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}\b)")
_ZERO_DECIMALS_RE = re.compile(r"(?<=\d)\.0+\b")
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: Any, numbers: bool = False) -> str:
    """SQuAD v1.1 normalisation; ``numbers=True`` is relaylens's normalisation, which first folds U+2019 into ``'``
    and canonicalises numbers (see the module docstring).

    >>> normalize_answer("The  Cat, a dog!"), normalize_answer("Twelve (12.0) items", numbers=True)
    ('cat dog', '12 12 items')
    >>> normalize_answer("Don\u2019t"), normalize_answer("Don\u2019t", numbers=True)
    ('don\u2019t', 'dont')
    """
    s = str(text).lower()
    if numbers:
        s = s.replace("\u2019", "'")
        s = _THOUSANDS_RE.sub("", s)
        s = _ZERO_DECIMALS_RE.sub("", s)
        s = _TENS_RE.sub(lambda m: str(int(_WORD_TO_DIGIT[m.group(1)]) + int(_WORD_TO_DIGIT.get(m.group(2), 0))), s)
        s = _NUMBER_WORD_RE.sub(lambda m: _WORD_TO_DIGIT[m.group(1)], s)
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES_RE.sub(" ", s)
    return " ".join(s.split())


def _refs(references: Any) -> list[str]:
    if isinstance(references, str) or not isinstance(references, Sequence):
        references = [references]
    refs = [str(r) for r in references if r is not None]
    if not refs:
        raise RecordError("scoring needs at least one reference answer; got none. Fix: give the record's answers")
    return refs


def exact_match(answer: str, references: Sequence[str] | str, numbers: bool = True) -> float:
    """1.0 when the normalised answer equals some normalised reference.

    >>> exact_match("three", ["3"]), exact_match("three", ["3"], numbers=False)
    (1.0, 0.0)
    """
    a = normalize_answer(answer, numbers)
    return float(any(a == normalize_answer(r, numbers) for r in _refs(references)))


def _token_f1(pred: list[str], gold: list[str]) -> float:
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:  # SQuAD v1.1 / InfiniteBench: no shared token is 0, also when both sides are empty
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1(answer: str, references: Sequence[str] | str, numbers: bool = True) -> float:
    """SQuAD token F1, max over references (no shared token, empty sides included, scores 0.0 as in SQuAD v1.1).

    >>> round(f1("Biscuit the Vizsla", ["Biscuit"]), 3), f1("A", ["a"])
    (0.667, 0.0)
    """
    pred = normalize_answer(answer, numbers).split()
    return max(_token_f1(pred, normalize_answer(r, numbers).split()) for r in _refs(references))


def contains(answer: str, references: Sequence[str] | str, numbers: bool = True) -> float:
    """1.0 when some normalised (non-empty) reference is a whole-token run inside the normalised answer.

    >>> contains("It is in the category", ["cat"]), contains("Your dog is Biscuit.", ["biscuit"])
    (0.0, 1.0)
    """
    a = f" {normalize_answer(answer, numbers)} "
    for r in _refs(references):
        n = normalize_answer(r, numbers)
        if n and f" {n} " in a:
            return 1.0
    return 0.0


_ABSTAIN_PATTERNS = [
    r"\bnot (?:been |ever "
    r")?(?:mentioned|specified|provided|stated|discussed|shared|included|given|available|recorded)\b",
    r"\b(?:never|did ?n[o']?t|didnt|have ?n[o']?t|haven't|has ?n[o']?t) (?:ever "
    r")?(?:mention|specif|provid|stat|discuss|shar|tell|told|say|said)",
    r"\bno (?:information|info|mention|record|details?|data|evidence|indication|reference)\b",
    r"\b(?:not|n't) (?:enough|sufficient|any) (?:information|info|details?|context|data)\b",
    r"\b(?:cannot|can ?not|can't|cant|unable to|not able to|impossible to) "
    r"(?:answer|determine|tell|say|know|find|provide|confirm|recall|identify)\b",
    r"\bi (?:do ?n[o']?t|don't|dont) (?:know|have (?:any |that |this |the )?(?:information|info|details?|record))\b",
    r"\b(?:information|info|details?) (?:is|are) (?:not |un)available\b",
    r"\b(?:unanswerable|not answerable)\b",
    r"\bthere (?:is|was) no (?:mention|information|record|indication)\b",
]
_ABSTAIN_RE = re.compile("|".join(_ABSTAIN_PATTERNS))


def is_abstention(answer: str) -> bool:
    """True when the answer says the requested information is unavailable ("not mentioned", "no information",
    "cannot answer", "I don't know", "you never told me" ...). Hedges such as "I'm not sure, maybe X" do not count.

    >>> is_abstention("I don't know."), is_abstention("Your dog is Biscuit."), is_abstention("There is no doubt: Rex")
    (True, False, False)
    """
    s = " ".join(str(answer).lower().replace("\u2019", "'").split())
    return bool(_ABSTAIN_RE.search(s))


_PAREN_LETTER_RE = re.compile(r"\(([a-d])\)", re.IGNORECASE)
_BARE_LETTER_RE = re.compile(r"\b([a-d])\b", re.IGNORECASE)


def extract_choice_personamem(text: str) -> set[str]:
    """PersonaMem letters: the ``(x)`` letters of the text after the last ``<final_answer>`` (the whole text when
    there is none), else its bare ``a``-``d`` words; lower case.

    >>> sorted(extract_choice_personamem("(a) or (b)?")), extract_choice_personamem("The answer is c")
    (['a', 'b'], {'c'})
    """
    tail = text.rsplit("<final_answer>", 1)[-1]
    letters = {m.lower() for m in _PAREN_LETTER_RE.findall(tail)}
    return letters or {m.lower() for m in _BARE_LETTER_RE.findall(tail)}


def personamem_choice_correct(answer: str, correct: str) -> bool:
    """Official rule: the extracted set equals ``{correct}`` after ``<final_answer>``, retried on the full text."""
    want = {correct.strip().strip("()").lower()}
    if extract_choice_personamem(answer) == want:
        return True
    full = {m.lower() for m in _PAREN_LETTER_RE.findall(answer)} or {m.lower() for m in _BARE_LETTER_RE.findall(answer)}
    return full == want


def infinitebench_choice_correct(answer: str, option_text: str, letter: str) -> bool:
    """InfiniteBench En.MC (``longbook_choice_eng``), the rule of upstream ``compute_scores.py`` step for step.

    >>> (infinitebench_choice_correct("B. The dog", "The dog", "B"),
    ...  infinitebench_choice_correct("So the answer is: B", "x", "B"))
    (True, True)
    >>> infinitebench_choice_correct("The CD was in the drawer, so B", "x", "B")  # "CD" is a piece of "ABCD": scan ends
    False
    """
    label = [option_text, letter.upper()]
    pred = answer.strip()
    if not pred:
        return False
    if pred[0] in "ABCD":
        return pred[0] in label
    if pred in label:
        return True
    for ch in ["\n", '"', "'", ".", ",", "?", "!", "{", "}"]:
        pred = pred.replace(ch, " ")
    while "  " in pred:  # only runs of spaces collapse (tabs stay), as upstream
        pred = pred.replace("  ", " ")
    for prefix in ["answer is:", "answer:", "answer is", "option is"]:
        idx = pred.find(prefix)
        if idx == -1:
            continue
        start = idx + len(prefix) + 1  # upstream skips one character after the prefix
        return start <= len(pred) and any(pred[start:].startswith(s) for s in label)
    for word in pred.split():
        if word in "ABCD":  # upstream's substring test: "A".."D", but also "AB", "BC", "CD", "ABC", ... stop here
            return word in label
    return False


def infinitebench_dialogue_correct(answer: str, label: str) -> bool:
    """InfiniteBench En.Dia (``longdialogue_qa_eng``): the label, as given (upstream labels are upper case), is one of
    the answer's upper-cased words after ``\\n : " ' . , ? ! { }`` become spaces (a multi-word or lower-case label
    never matches, as upstream).

    >>> infinitebench_dialogue_correct("It was john, I think.", "JOHN"), infinitebench_dialogue_correct("john", "John")
    (True, False)
    """
    for ch in ["\n", ":", '"', "'", ".", ",", "?", "!", "{", "}"]:
        answer = answer.replace(ch, " ")
    return label in [w.upper() for w in answer.split()]


def record_field(record: Any, name: str, default: Any = None) -> Any:
    """A field of a :class:`~relaylens.datasets.records.Record` or of a mapping with the same keys."""
    return record.get(name, default) if isinstance(record, Mapping) else getattr(record, name, default)


def record_references(record: Any) -> Any:
    """The reference answers of a record (``answers``, or ``references`` in mappings); None when it has neither."""
    refs = record_field(record, "answers")
    return record_field(record, "references") if refs is None else refs


def score_answer(record: Any, answer: str) -> dict[str, float]:
    """Score one answer: ``{"exact_match", "f1", "contains", "abstention"}`` plus ``"choice_accuracy"`` for
    multiple-choice records and ``"locomo_f1"`` for LoCoMo records.

    ``record`` is a :class:`~relaylens.datasets.records.Record` or a mapping with ``answers`` (or ``references``) and
    optionally ``question_type``, ``is_abstention``, ``options``, ``correct_option``, ``source`` and (LoCoMo)
    ``meta["category"]`` or ``category``.

    >>> score_answer({"answers": ["Biscuit"]}, "Biscuit, your dog.")
    {'exact_match': 0.0, 'f1': 0.5, 'contains': 1.0, 'abstention': 0.0}
    >>> score_answer({"answers": ["You did not mention it"], "is_abstention": True}, "I don't know.")["exact_match"]
    1.0
    """
    refs = record_references(record)
    if refs is None:
        raise RecordError("score_answer needs the record's reference answers ('answers' or 'references'); got "
                          "neither. Fix: give the record its answers")
    refs = _refs(refs)
    answer = "" if answer is None else str(answer)
    qtype = record_field(record, "question_type", "") or ""
    numbers = qtype != "longbook_qa_eng"  # InfiniteBench En.QA: the official plain SQuAD token F1
    abstains = float(is_abstention(answer))
    out = {"exact_match": exact_match(answer, refs, numbers), "f1": f1(answer, refs, numbers),
           "contains": contains(answer, refs, numbers), "abstention": abstains}
    if qtype == "longdialogue_qa_eng":
        out["contains"] = float(infinitebench_dialogue_correct(answer, refs[0]))
    if record_field(record, "is_abstention", False):
        out.update(exact_match=abstains, f1=abstains, contains=abstains)
    options = record_field(record, "options")
    if options:
        correct = record_field(record, "correct_option")
        if not correct:
            raise RecordError(f"record {record_field(record, 'record_id', '?')!r} has options but no correct_option; "
                              "expected a letter like 'c'. Fix: set correct_option")
        if qtype == "longbook_choice_eng" or record_field(record, "source") == "infinitebench":
            ok = infinitebench_choice_correct(answer, refs[0], correct)
        else:
            ok = personamem_choice_correct(answer, correct)
        out["choice_accuracy"] = float(ok)
    if record_field(record, "source") == "locomo":
        out["locomo_f1"] = _locomo_f1(record, answer, refs[0])
    return out


def _locomo_f1(record: Any, answer: str, reference: str) -> float:
    """LoCoMo's own score of ``answer`` (:func:`relaylens.scoring.locomo.locomo_score`) by the record's category."""
    from relaylens.scoring.locomo import locomo_score  # noqa: PLC0415 - NLTK's stemmer loads only for LoCoMo records

    category = (record_field(record, "meta") or {}).get("category", record_field(record, "category"))
    if category is None:
        raise RecordError(f"LoCoMo record {record_field(record, 'record_id', '?')!r} has no category; expected "
                          "meta['category'] 1-5 (set by the LoCoMo reader). Fix: load the file with format='locomo'")
    return locomo_score(answer, reference, int(category))


def __getattr__(name: str):  # old names of this module (relaylens.MOVED_NAMES), until relaylens.REMOVED_IN
    return moved_name(__name__, name)
