"""Reader for LongMemEval S / M / oracle (xiaowu0162/LongMemEval), cleaned or original release.

Accepts a JSON array, a single JSON object, or JSON Lines, with or without a ``.json`` extension. Validation:
``question_id`` a string (``_abs`` suffix = abstention), ``answer`` a string or a bare number, dates in
``YYYY/MM/DD (Dow) HH:MM``, ``haystack_session_ids`` / ``haystack_dates`` / ``haystack_sessions`` of equal length,
turns with ``role`` user/assistant and string ``content``, ``has_answer`` a bool where present, and every
``answer_session_ids`` entry naming a haystack session.

Example:
    >>> from relaylens.datasets import bundled_sample_path, load_records
    >>> rec = load_records(bundled_sample_path(), format="longmemeval")[0]
    >>> rec.sessions[0].date[4], rec.source
    ('/', 'longmemeval')
"""

from __future__ import annotations

import math
from pathlib import Path

from relaylens.datasets.common import get_field, iter_json_objects, parse_lme_date, record_error
from relaylens.datasets.formats import DatasetFormat, has_keys, json_head
from relaylens.datasets.records import Record, RecordCollector, Session, Turn, answer_to_str

QUESTION_TYPES = (
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "temporal-reasoning",
    "knowledge-update",
)
ROLES = ("user", "assistant")
_KNOWN_KEYS = {"question_id", "question_type", "question", "answer", "question_date", "haystack_session_ids",
               "haystack_dates", "haystack_sessions", "answer_session_ids"}


def read_longmemeval(path: Path, collector: RecordCollector, source: str = "longmemeval") -> None:
    """Parse every record of ``path`` into ``collector`` (see the module docstring for the checks)."""
    for where, obj in iter_json_objects(path):
        if isinstance(obj, dict) and isinstance(obj.get("question_id"), str):
            where = f"record {obj['question_id']!r} ({where})"
        collector.add(where, lambda obj=obj, where=where: parse_record(obj, path, where, source))


def parse_record(obj, path, where: str, source: str = "longmemeval") -> Record:
    """One LongMemEval object as a :class:`Record`; :class:`~relaylens.errors.RecordError` when malformed."""
    if isinstance(obj, Exception):
        raise obj
    if not isinstance(obj, dict):
        raise record_error(path, where, "<record>", "a JSON object", obj, "each record must be a JSON object")
    qid = get_field(obj, "question_id", str, path, where)
    qtype = get_field(obj, "question_type", str, path, where)
    if qtype not in QUESTION_TYPES:
        raise record_error(path, where, "question_type", f"one of {QUESTION_TYPES}", qtype,
                           "use a LongMemEval type (abstention keeps its base type; `_abs` in the id marks it)")
    question = get_field(obj, "question", str, path, where)
    raw_answer = get_field(obj, "answer", (str, int, float), path, where,
                           fix="store the answer as a string or a bare JSON number")
    if isinstance(raw_answer, float) and not math.isfinite(raw_answer):
        raise record_error(path, where, "answer", "a string or a finite number", raw_answer,
                           "NaN/Infinity are not answers; store the answer text")
    qdate = get_field(obj, "question_date", str, path, where)
    parse_lme_date(qdate, path, where, "question_date")
    ids = get_field(obj, "haystack_session_ids", list, path, where)
    dates = get_field(obj, "haystack_dates", list, path, where)
    raw_sessions = get_field(obj, "haystack_sessions", list, path, where)
    if not len(ids) == len(dates) == len(raw_sessions):
        raise record_error(path, where, "haystack_sessions", "parallel lists of equal length",
                           f"{len(ids)} ids, {len(dates)} dates, {len(raw_sessions)} sessions",
                           "haystack_session_ids, haystack_dates and haystack_sessions must align one-to-one")
    answer_ids = get_field(obj, "answer_session_ids", list, path, where)
    id_set: dict[str, int] = {}
    for k, sid in enumerate(ids):
        if not isinstance(sid, str):
            raise record_error(path, where, f"haystack_session_ids[{k}]", "a string", sid, "session ids are strings")
        if sid in id_set:  # one id on two sessions would mark a distractor as gold evidence
            raise record_error(path, where, f"haystack_session_ids[{k}]", f"an id not already used (it is also "
                               f"haystack_session_ids[{id_set[sid]}])", sid, "give every haystack session its own id")
        id_set[sid] = k
    for k, sid in enumerate(answer_ids):
        if sid not in id_set:
            raise record_error(path, where, f"answer_session_ids[{k}]", "an id listed in haystack_session_ids", sid,
                               "list only sessions present in the haystack (or load with lenient=True to skip)")
    evidence = set(answer_ids)
    sessions = []
    for k, (sid, date, turns) in enumerate(zip(ids, dates, raw_sessions)):
        parse_lme_date(date, path, where, f"haystack_dates[{k}]")
        sessions.append(Session(sid, date, _parse_turns(turns, path, where, k), sid in evidence))
    meta = {key: value for key, value in obj.items() if key not in _KNOWN_KEYS}
    return Record(
        record_id=qid,
        question=question,
        answers=(answer_to_str(raw_answer),),
        question_type=qtype,
        question_date=qdate,
        sessions=tuple(sessions),
        evidence_session_ids=tuple(answer_ids),
        is_abstention=qid.endswith("_abs"),
        source=source,
        cluster_id=None,
        raw_answer=raw_answer,
        meta=meta,
    )


def _parse_turns(turns, path, where: str, k: int) -> tuple[Turn, ...]:
    field = f"haystack_sessions[{k}]"
    if not isinstance(turns, list):
        raise record_error(path, where, field, "a list of turns", turns,
                           "a session is a list of {role, content} objects")
    out = []
    for j, turn in enumerate(turns):
        tf = f"{field}[{j}]"
        if not isinstance(turn, dict):
            raise record_error(path, where, tf, "a {role, content} object", turn, "each turn is a JSON object")
        role = turn.get("role")
        if role not in ROLES:
            raise record_error(path, where, tf + ".role", f"one of {ROLES}", role, "set role to 'user' or 'assistant'")
        content = turn.get("content")
        if not isinstance(content, str):
            raise record_error(path, where, tf + ".content", "a string", content, "store the turn text as a string")
        has_answer = turn.get("has_answer", False)
        if not isinstance(has_answer, bool):
            raise record_error(path, where, tf + ".has_answer", "true or false", has_answer,
                               "write has_answer as a JSON bool")
        out.append(Turn(role, content, has_answer))
    return tuple(out)


def bundled_sample_path() -> Path:
    """Path of the bundled ``sample_longmemeval.json`` (24 synthetic records, ~2k-token histories)."""
    return Path(__file__).resolve().parent.parent / "data" / "sample_longmemeval.json"


def sniff(path: Path) -> bool:
    """A LongMemEval file: JSON with ``question_id`` and the haystack sessions (or their ids)."""
    head = json_head(path)
    return has_keys(head,
                    "question_id") and (has_keys(head, "haystack_sessions") or has_keys(head, "haystack_session_ids"))


FORMAT = DatasetFormat("longmemeval", read_longmemeval, sniff, sample=bundled_sample_path)
