"""Dataset records: one question with its conversation history, in a form every dataset reader produces.

A :class:`Record` holds the history as :class:`Session` s of :class:`Turn` s, the question, the reference answers
and the gold evidence annotations (``Session.is_evidence`` / ``Turn.has_answer``). Readers for each dataset live
in :mod:`relaylens.datasets`, whose :func:`relaylens.datasets.load_records` picks one by file format.

Example:
    >>> rec = Record(record_id="q1", question="What is my dog called?", answers=("Biscuit",),
    ...              question_type="single-session-user", question_date=None,
    ...              sessions=(Session("s1", None, (Turn("user", "My dog is Biscuit.", True),), True),),
    ...              evidence_session_ids=("s1",), is_abstention=False)
    >>> rec.has_evidence_annotations, rec.num_turns
    (True, 1)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relaylens.errors import RecordError, shown
from relaylens.scoring.metrics import normalize_answer


@dataclass(frozen=True)
class Turn:
    """One message of a session. ``has_answer`` is gold turn-level evidence and is never rendered."""

    role: str
    content: str
    has_answer: bool = False


@dataclass(frozen=True)
class Session:
    """One dated conversation. ``date`` keeps the dataset's own string (LongMemEval: ``2023/05/30 (Tue) 23:40``)."""

    session_id: str
    date: str | None
    turns: tuple[Turn, ...]
    is_evidence: bool = False

    @property
    def text(self) -> str:
        """The turns' contents joined by newlines (what a retriever reads)."""
        return "\n".join(t.content for t in self.turns)


@dataclass(frozen=True)
class Record:
    """One question with its history.

    Attributes:
        record_id: the dataset's question id (LongMemEval ``question_id``; ``_abs`` suffix kept).
        question: the question text shown to the model.
        answers: reference answers as strings (numbers converted with :func:`answer_to_str`).
        question_type: the dataset's type, normalised (LongMemEval types; PersonaMem aliases resolved).
        question_date: the dataset's date string or ``None``.
        sessions: the history in file order (rendering sorts LongMemEval sessions by date).
        evidence_session_ids: gold evidence sessions (may be empty: no session-level gold).
        is_abstention: the question is unanswerable from the history (LongMemEval ``_abs``).
        options: multiple-choice options as displayed, letter prefix included (``"(a) ..."``, ``"A. ..."``).
        correct_option: the correct option's bare letter, lower case (``"c"``).
        source: reader name, e.g. ``"longmemeval"``, ``"personamem"``, ``"synthetic"``.
        cluster_id: records sharing a conversation / persona / book (bootstrap clusters); ``None``: own cluster.
        raw_answer: the answer exactly as the file had it (a number stays a number).
        meta: everything else the file carried that relaylens does not interpret.
    """

    record_id: str
    question: str
    answers: tuple[str, ...]
    question_type: str
    question_date: str | None
    sessions: tuple[Session, ...]
    evidence_session_ids: tuple[str, ...]
    is_abstention: bool
    options: tuple[str, ...] | None = None
    correct_option: str | None = None
    source: str = ""
    cluster_id: str | None = None
    raw_answer: Any = None
    meta: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def has_evidence_annotations(self) -> bool:
        """True when some session is gold evidence or some turn carries ``has_answer``."""
        return any(s.is_evidence or any(t.has_answer for t in s.turns) for s in self.sessions)

    @property
    def has_turn_annotations(self) -> bool:
        """True when some turn carries ``has_answer`` (turn-level probes need this)."""
        return any(t.has_answer for s in self.sessions for t in s.turns)

    @property
    def is_multiple_choice(self) -> bool:
        return self.options is not None

    @property
    def num_turns(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    @property
    def cluster(self) -> str:
        """The bootstrap cluster key: ``cluster_id`` or the record's own id."""
        return self.cluster_id if self.cluster_id is not None else self.record_id


def answer_to_str(value: Any) -> str:
    """A reference answer as a string: ``3`` -> ``"3"``, ``3.0`` -> ``"3"``, ``2.5`` -> ``"2.5"``.

    >>> answer_to_str(12), answer_to_str(4.0), answer_to_str("Biscuit")
    ('12', '4', 'Biscuit')
    """
    if isinstance(value, bool):
        raise RecordError(f"an answer must be a string or a number, not a bool ({value!r}). Fix: store the answer "
                          "as text or a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise RecordError(f"an answer must be a finite number, not {value!r}. Fix: store the answer as text or a "
                          "finite number")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@dataclass(frozen=True)
class LoadReport:
    """What a lenient load kept and skipped. ``skipped`` holds ``(record id or line, reason)`` pairs."""

    path: str
    format: str
    loaded: int
    skipped: tuple[tuple[str, str], ...] = ()

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)

    def summary(self) -> str:
        head = f"{self.path}: loaded {self.loaded} {self.format} records, skipped {self.num_skipped}"
        return head + "".join(f"\n  {shown(where)}: {shown(why)}" for where, why in self.skipped)  # one line each


class RecordCollector:
    """Collects records from a reader; in lenient mode a :class:`RecordError` skips the record instead.

    Every record is checked on the way in (:func:`check_record`), and record ids must be unique: a second record
    with an id already seen is refused, naming both positions (results are keyed by id; a duplicate would be
    skipped as "done earlier")."""

    def __init__(self, lenient: bool, path: str | Path = "<records>"):
        self.lenient = lenient
        self.path = path
        self.records: list[Record] = []
        self.skipped: list[tuple[str, str]] = []
        self._where: dict[str, str] = {}

    def add(self, where: str, build) -> None:
        """Call ``build()`` and keep its record; on :class:`RecordError` re-raise or (lenient) note the skip."""
        try:
            record = build()
            check_record(record, self.path, where)
            first = self._where.get(record.record_id)
            if first is not None:
                raise RecordError(f"{self.path}: {where}: record id {record.record_id!r} is already used by {first}; "
                                  "ids must be unique (results are keyed by record id). Fix: give one of them another "
                                  "id, or drop the duplicate")
            self._where[record.record_id] = where
            self.records.append(record)
        except RecordError as err:
            self.fail(where, err)

    def fail(self, where: str, err: RecordError) -> None:
        """Raise ``err``, or (lenient) note that the record at ``where`` was skipped."""
        if not self.lenient:
            raise err
        self.skipped.append((where, str(err)))


def _encodable(text: Any, path, where: str, field: str) -> None:
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise RecordError(f"{path}: {where}: field {field!r} holds an unpaired surrogate ({text[err.start]!r} at "
                              f"character {err.start}), which is not text any tokenizer or file can hold. Fix: repair "
                              "the string (a broken \\ud8xx escape in the JSON?)") from None


_LABEL = re.compile(r"^\s*(?:\(\s*[A-Za-z]\s*\)|[A-Za-z][.)])\s*")


def option_text(option: str) -> str:
    """An option as compared for duplicates: its letter label (``(a)``, ``A.``, ``b)``) removed, case folded,
    spacing collapsed.

    >>> option_text("(a) The  Red Fox"), option_text("B. the red fox")
    ('the red fox', 'the red fox')
    """
    return " ".join(_LABEL.sub("", str(option), count=1).casefold().split())


def check_record(record: Record, path="<records>", where: str = "<record>") -> None:
    """Refuse records that would be scored or tokenised wrongly without an error later.

    * every text field is valid Unicode (no unpaired surrogates);
    * the question holds some text (an empty question would be answered from the history alone);
    * multiple-choice options are non-empty and pairwise different once their letter labels, case and spacing are
      set aside (two equal options would make a right answer count as wrong);
    * every reference answer of an answerable record keeps some text after answer normalisation (``""``, ``"A"``,
      ``"The"`` or ``"?"`` would let an empty model answer score exact match and F1 of 1).

    >>> bad = Record("q1", "Dog?", ("The",), "t", None, (), (), False)
    >>> check_record(bad, "f.json", "item 0")
    Traceback (most recent call last):
    ...
    relaylens.errors.RecordError: f.json: item 0: reference answer 'The' is empty after answer normalisation (lower case, punctuation and the articles a/an/the removed), so an empty model answer would score exact match 1. Fix: give the record a real reference answer, or drop it
    """  # noqa: E501 - doctest: an exception message is matched on one line
    _encodable(record.record_id, path, where, "id")
    _encodable(record.question, path, where, "question")
    for k, answer in enumerate(record.answers):
        _encodable(answer, path, where, f"answers[{k}]")
    for k, option in enumerate(record.options or ()):
        _encodable(option, path, where, f"options[{k}]")
    for i, session in enumerate(record.sessions):
        _encodable(session.session_id, path, where, f"sessions[{i}].id")
        for j, turn in enumerate(session.turns):
            _encodable(turn.content, path, where, f"sessions[{i}].turns[{j}].content")
    if not isinstance(record.question, str) or not record.question.strip():
        raise RecordError(f"{path}: {where}: the question is empty ({record.question!r}); the model would answer "
                          "nothing in particular. Fix: fill in the question text, or drop the record")
    seen: dict[str, int] = {}
    for k, option in enumerate(record.options or ()):
        text = option_text(option)
        if not text:
            raise RecordError(f"{path}: {where}: option {k} ({option!r}) is empty once its label is removed. Fix: give "
                              "every option its text, or drop the record")
        if text in seen:
            raise RecordError(f"{path}: {where}: options {seen[text]} and {k} are the same option "
                              f"({record.options[seen[text]]!r}, {option!r}), so choosing either could be right. Fix: "
                              "make the options distinct, or drop the record")
        seen[text] = k
    if not record.is_abstention:
        for answer in record.answers:
            if not normalize_answer(answer) or not normalize_answer(answer, numbers=True):
                raise RecordError(f"{path}: {where}: reference answer {answer!r} is empty after answer normalisation "
                                  "(lower case, punctuation and the articles a/an/the removed), so an empty model "
                                  "answer would score exact match 1. Fix: give the record a real reference answer, "
                                  "or drop it")
