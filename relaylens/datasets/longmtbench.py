"""Reader for Long-MT-Bench+ (SeCom; HF ``panzs19/Long-MT-Bench-Plus``, split ``test``): parquet, JSON or JSONL.

Each row is one conversation: ``conversation_id``, ``sessions`` (list of sessions, each a list of exchange strings
``"<Turn 0>: [human]: ...\\n[bot]: ..."``; the ``<Turn n>:`` prefix may be absent), ``questions`` and ``answers``
(aligned). Every question becomes one :class:`~relaylens.datasets.records.Record` over the whole conversation, clustered
by ``conversation_id``. There are no dates and no gold evidence in the release.

Example:
    >>> split_exchange("<Turn 0>: [human]: Hi there\\n[bot]: Hello!")
    (Turn(role='user', content='Hi there', has_answer=False), Turn(role='assistant', content='Hello!', has_answer=False))
"""  # noqa: E501 - doctest: the expected output stays on one line

from __future__ import annotations

import re
from pathlib import Path

from relaylens.datasets.common import iter_json_objects, record_error
from relaylens.datasets.formats import DatasetFormat, has_keys, json_head
from relaylens.datasets.records import Record, RecordCollector, Session, Turn
from relaylens.errors import RecordError

_TURN_PREFIX = re.compile(r"^\s*<Turn\s*\d+>\s*:\s*")
_EXCHANGE = re.compile(r"^\s*\[human\]\s*:\s*(.*?)\s*\[bot\]\s*:\s*(.*?)\s*\Z", re.S)
_HUMAN_ONLY = re.compile(r"^\s*\[human\]\s*:\s*(.*?)\s*\Z", re.S)
QUESTION_TYPE = "long-mt-bench-plus"


def split_exchange(text: str) -> tuple[Turn, ...]:
    """One ``[human]: ... [bot]: ...`` exchange as a user turn and an assistant turn (unmarked text: one user turn)."""
    body = _TURN_PREFIX.sub("", text, count=1)
    m = _EXCHANGE.match(body)
    if m:
        return Turn("user", m.group(1)), Turn("assistant", m.group(2))
    m = _HUMAN_ONLY.match(body)
    return (Turn("user", m.group(1) if m else body.strip()),)


def _rows(path: Path):
    if path.suffix == ".parquet":
        import pandas as pd  # noqa: PLC0415 - import cost: pandas loads on first use

        try:
            frame = pd.read_parquet(path)
        except (ValueError, TypeError, NotImplementedError) as exc:  # pyarrow: ArrowInvalid, ArrowTypeError, ...
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise RecordError(f"{path}: not a readable parquet file ({type(exc).__name__}: {first}). Fix: pass the "
                              "Long-MT-Bench+ parquet file as downloaded (re-download it if a transfer was cut short), "
                              "or its JSON form") from None
        for i, row in enumerate(frame.to_dict("records")):
            yield f"row {i}", row
    else:
        yield from iter_json_objects(path)


def _as_list(value):
    """parquet gives numpy arrays for list columns; JSON gives lists."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        return value.tolist()
    return value


def read_longmtbench(path: Path, collector: RecordCollector) -> None:
    for where, row in _rows(path):
        if isinstance(row, dict) and "conversation_id" in row:
            where = f"conversation {row['conversation_id']!r} ({where})"
        try:
            records = parse_conversation(row, path, where)
        except RecordError as err:
            collector.fail(where, err)
            continue
        for j, rec in enumerate(records):
            collector.add(f"{where} question {j}", lambda rec=rec: rec)


def parse_conversation(row, path, where: str) -> list[Record]:
    if isinstance(row, Exception):
        raise row
    if not isinstance(row, dict):
        raise record_error(path, where, "<row>", "an object with conversation_id, sessions, questions, answers", row,
                           "pass a Long-MT-Bench+ file")
    conv = row.get("conversation_id")
    if conv is None:
        raise record_error(path, where, "conversation_id", "a conversation id", None, "add conversation_id")
    conv = str(conv)
    raw_sessions = _as_list(row.get("sessions"))
    questions = _as_list(row.get("questions"))
    answers = _as_list(row.get("answers"))
    if not isinstance(raw_sessions, list) or not raw_sessions:
        raise record_error(path, where, "sessions", "a non-empty list of sessions (lists of exchange strings)",
                           raw_sessions, "store sessions as list[list[str]]")
    if not isinstance(questions, list) or not isinstance(answers, list) or len(questions) != len(answers):
        raise record_error(path, where, "answers", "a list aligned with questions",
                           f"{_len(questions)} questions, {_len(answers)} answers",
                           "give exactly one answer per question")
    sessions = []
    for k, session in enumerate(raw_sessions):
        session = _as_list(session)
        if not isinstance(session, list) or not all(isinstance(x, str) for x in session):
            raise record_error(path, where, f"sessions[{k}]", "a list of exchange strings", session,
                               "store each session as a list of strings")
        turns = tuple(t for exchange in session for t in split_exchange(exchange))
        sessions.append(Session(f"{conv}_s{k}", None, turns))
    out = []
    for j, (q, a) in enumerate(zip(questions, answers)):
        if not isinstance(q, str) or not isinstance(a, str):
            raise record_error(path, where, f"questions[{j}]/answers[{j}]", "strings", (q, a), "store text as strings")
        out.append(Record(
            record_id=f"{conv}_q{j}", question=q, answers=(a,), question_type=QUESTION_TYPE, question_date=None,
            sessions=tuple(sessions), evidence_session_ids=(), is_abstention=False, source="longmtbench",
            cluster_id=conv, raw_answer=a, meta={"conversation_id": conv, "question_index": j},
        ))
    return out


def _len(x):
    return len(x) if isinstance(x, list) else type(x).__name__


def sniff(path: Path) -> bool:
    """Long-MT-Bench+: its parquet file, or JSON with ``conversation_id`` and ``sessions``."""
    return path.suffix == ".parquet" or has_keys(json_head(path), "conversation_id", "sessions")


FORMAT = DatasetFormat("longmtbench", read_longmtbench, sniff)
