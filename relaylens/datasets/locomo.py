"""Reader for LoCoMo (snap-research/locomo, ``data/locomo10.json``): one record per question over its conversation.

The file is a JSON array of conversations. Each has ``sample_id`` (``conv-26``), ``conversation`` (``speaker_a``,
``speaker_b``, ``session_N``: a list of turns ``{speaker, dia_id, text[, blip_caption]}``, ``session_N_date_time``)
and ``qa`` (``question``, ``answer``, ``evidence``: dialogue ids such as ``D1:3`` = session 1, turn 3, ``category``).

Records:

* id ``{sample_id}:q{index:04d}`` (``conv-26:q0007``, the question's index in ``qa``), ``cluster_id`` the
  conversation id (every question of a conversation shares one history: one bootstrap cluster, one prefill);
* the history is the whole conversation, sessions in their number order, one turn per utterance whose text is
  ``{speaker} said, "{text}"`` (plus `` and shared {blip_caption}.`` for a shared photo), rendered by
  :func:`locomo_layout` after LoCoMo's own QA prompt (``task_eval/gpt_utils.py``): a head naming the two speakers,
  then per session ``DATE: {session_N_date_time}`` / ``CONVERSATION:`` and its turns;
* ``question_type`` from ``category`` (:data:`CATEGORIES`: the mapping of LoCoMo's evaluation code, which differs
  from the order the paper lists the types in); category 2 questions get LoCoMo's date hint (:data:`TEMPORAL_HINT`);
* category 5 (adversarial: the asked-about thing is not in the conversation) is an abstention record; its reference
  is ``adversarial_answer`` (the tempting wrong answer: an answer that abstains is the right one);
* gold evidence: the turns named by ``evidence`` carry ``has_answer`` (turn level), the sessions holding them are
  evidence sessions (session level).

Malformed evidence ids. The upstream file has nine evidence strings that name no turn as written; the reader applies
these rules, in order, and counts every use in the record's ``meta`` (:func:`evidence_counts` sums them):

1. *split*: a string holding several ids separated by ``;``, ``,`` or spaces (``'D8:6; D9:17'``,
   ``'D9:1 D4:4 D4:6'``) is read as those ids;
2. *normalised*: a stray colon after ``D`` or leading zeros (``'D:11:26'`` -> ``D11:26``, ``'D30:05'`` -> ``D30:5``);
3. *unresolved*: an id that still names no turn (``'D'``, ``D10:19`` in a 16-turn session) is left out of the mask
   and listed in ``meta["evidence_unresolved"]``, as long as another id of the question names a turn; a question
   whose every id names no turn is refused (:class:`~relaylens.errors.RecordError`), and ``strict_evidence=True``
   refuses any unresolved id. A question with no evidence ids (four open-domain questions upstream) has no gold.

Example:
    >>> parse_evidence(["D1:3", "D:1:04; D9:9"], {(1, 3): "D1:3", (1, 4): "D1:4"})
    (('D1:3', 'D1:4'), ['D:1:04; D9:9'], ['D:1:04'], ['D9:9'])
    >>> CATEGORIES[1], CATEGORIES[5]
    ('multi_hop', 'adversarial')
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

from relaylens.datasets.common import get_field, iter_json_objects, record_error
from relaylens.datasets.formats import DatasetFormat, has_keys, json_head
from relaylens.datasets.records import Record, RecordCollector, Session, Turn, answer_to_str
from relaylens.errors import RecordError

log = logging.getLogger("relaylens.datasets.records")

SOURCE = "locomo"
CATEGORIES = {1: "multi_hop", 2: "temporal", 3: "open_domain", 4: "single_hop", 5: "adversarial"}
"""LoCoMo ``category`` -> question type, as LoCoMo's ``task_eval/evaluation.py`` scores them (1: split multi-answer
F1; 2, 3, 4: F1; 5: the adversarial rule) and as the data reads (2: "When did ..."; 3: world knowledge)."""
ABSTENTION_CATEGORY = 5
TEMPORAL_HINT = " Use DATE of CONVERSATION to answer with an approximate date."
"""What LoCoMo's own QA prompt appends to a category 2 (temporal) question."""
HEAD = ("Below is a conversation between two people: {a} and {b}. The conversation takes place over multiple days "
        "and the date of each conversation is written at the beginning of the conversation.\n\n")
QA_INSTRUCTION = ("Based on the above context, write an answer in the form of a short phrase for the following "
                  "question. Answer with exact words from the context whenever possible.\n\n")
_SESSION_KEY = re.compile(r"session_(\d+)")
_DIA_ID = re.compile(r"D:?0*(\d+):0*(\d+)")
_SEPARATORS = re.compile(r"[;,\s]+")
_FIX_SCHEMA = "pass LoCoMo's locomo10.json (relaylens data pull locomo --accept-license) or a file of its layout"


def parse_evidence(raw: list, turns: dict[tuple[int, int], str], strict: bool = False,
                   where: str = "") -> tuple[tuple[str, ...], list[str], list[str], list[str]]:
    """``(resolved ids, split strings, normalised ids, unresolved ids)`` of one question's ``evidence`` list, by the
    rules of the module docstring; ``turns`` maps ``(session, turn)`` to the turn's ``dia_id``."""
    resolved, split, normalised, unresolved = [], [], [], []
    for item in raw:
        parts = [p for p in _SEPARATORS.split(item.strip()) if p]
        if len(parts) > 1:
            split.append(item)
        for part in parts:
            m = _DIA_ID.fullmatch(part)
            dia = turns.get((int(m.group(1)), int(m.group(2)))) if m else None
            if dia is None:
                unresolved.append(part)
                continue
            if dia != part:
                normalised.append(part)
            if dia not in resolved:
                resolved.append(dia)
    if unresolved and (strict or not resolved):
        raise RecordError(f"{where}: evidence id(s) {unresolved} name no turn of the conversation (a dialogue id "
                          f"is 'D<session>:<turn>', e.g. 'D1:3'){'' if strict else ' and no other id of it does'}. "
                          "Fix: correct the ids, or drop the question")
    return tuple(resolved), split, normalised, unresolved


def read_locomo(path: Path, collector: RecordCollector, strict_evidence: bool = False) -> None:
    """Parse every question of every conversation of ``path`` into ``collector`` (see the module docstring)."""
    for where, conv in iter_json_objects(path):
        if isinstance(conv, dict) and isinstance(conv.get("sample_id"), str):
            where = f"conversation {conv['sample_id']!r} ({where})"
        try:
            cid, sessions, turns, speakers, qa = parse_conversation(conv, path, where)
        except RecordError as err:
            collector.fail(where, err)
            continue
        for k, item in enumerate(qa):
            at = f"{where} question {k}"
            collector.add(at, lambda item=item, k=k, at=at: parse_question(
                item, k, cid, sessions, turns, speakers, path, at, strict_evidence))
    counts = evidence_counts(collector.records)
    if counts["ids_split"] or counts["ids_normalised"] or counts["ids_unresolved"]:
        log.warning("%s: LoCoMo evidence ids: %d split, %d normalised, %d naming no turn left out of the masks "
                    "(relaylens.datasets.locomo rules)", path, counts["ids_split"], counts["ids_normalised"],
                    counts["ids_unresolved"])


def parse_conversation(conv, path, where: str):
    """``(conversation id, [(session without gold, its raw turns)], {(session, turn): dia_id}, (speaker_a,
    speaker_b), qa)`` of one conversation;
    :class:`~relaylens.errors.RecordError` naming the file and the conversation when malformed."""
    if isinstance(conv, Exception):
        raise conv
    if not isinstance(conv, dict):
        raise record_error(path, where, "<conversation>", "a JSON object with sample_id, conversation and qa",
                           conv, _FIX_SCHEMA)
    cid = get_field(conv, "sample_id", str, path, where, _FIX_SCHEMA)
    body = get_field(conv, "conversation", dict, path, where, _FIX_SCHEMA)
    qa = get_field(conv, "qa", list, path, where, _FIX_SCHEMA)
    speakers = tuple(get_field(body, key, str, path, where, _FIX_SCHEMA) for key in ("speaker_a", "speaker_b"))
    numbers = sorted(int(m.group(1)) for key in body if (m := _SESSION_KEY.fullmatch(key)))
    if not numbers:
        raise record_error(path, where, "conversation", "at least one 'session_N' list of turns",
                           sorted(body)[:8], "give the conversation its sessions, or drop it")
    sessions, turns = [], {}
    for n in numbers:
        field = f"conversation.session_{n}"
        raw = body[f"session_{n}"]
        if not isinstance(raw, list) or not raw:
            raise record_error(path, where, field, "a non-empty list of turns", raw,
                               "each session is a list of {speaker, dia_id, text} objects")
        date = body.get(f"session_{n}_date_time")
        if date is not None and not isinstance(date, str):
            raise record_error(path, where, f"{field}_date_time", "a date string", date, "store the date as text")
        out = []
        for j, turn in enumerate(raw):
            at = f"{field}[{j}]"
            speaker, dia, text = (get_field(turn, key, str, path, f"{where}: {at}", _FIX_SCHEMA)
                                  for key in ("speaker", "dia_id", "text"))
            m = _DIA_ID.fullmatch(dia)
            key = (int(m.group(1)), int(m.group(2))) if m else (n, -1 - j)
            if key in turns:
                raise record_error(path, where, f"{at}.dia_id", "a dialogue id used once", dia,
                                   "give every turn its own dia_id")
            turns[key] = dia
            caption = turn.get("blip_caption")
            line = f'{speaker} said, "{text}"' + (f" and shared {caption}." if isinstance(caption, str) else "")
            out.append(Turn(speaker, line))
        sessions.append((Session(f"session_{n}", date, tuple(out)), raw))
    return cid, sessions, turns, speakers, qa


def parse_question(item, k: int, cid: str, sessions, turns, speakers, path, where: str,
                   strict_evidence: bool = False) -> Record:
    """One ``qa`` entry as a :class:`Record` over its conversation's sessions."""
    if not isinstance(item, dict):
        raise record_error(path, where, "<question>", "a {question, answer, evidence, category} object", item,
                           _FIX_SCHEMA)
    question = get_field(item, "question", str, path, where)
    category = get_field(item, "category", int, path, where)
    if category not in CATEGORIES:
        raise record_error(path, where, "category", f"one of {sorted(CATEGORIES)}", category,
                           "use LoCoMo's category numbers (1 multi-hop ... 5 adversarial)")
    key = "adversarial_answer" if category == ABSTENTION_CATEGORY else "answer"
    answer = get_field(item, key, (str, int, float), path, where, f"give the question its {key!r}")
    raw_evidence = get_field(item, "evidence", list, path, where)
    if not all(isinstance(e, str) for e in raw_evidence):
        raise record_error(path, where, "evidence", "a list of dialogue id strings ('D1:3')", raw_evidence,
                           "write each evidence id as a string")
    evidence, split, normalised, unresolved = parse_evidence(raw_evidence, turns, strict_evidence,
                                                             f"{path}: {where}")
    gold = set(evidence)
    session_list, gold_sessions = [], []
    for plain, raw in sessions:  # sessions without gold are shared by every question of the conversation
        if not any(r["dia_id"] in gold for r in raw):
            session_list.append(plain)
            continue
        marked = tuple(Turn(t.role, t.content, r["dia_id"] in gold) for t, r in zip(plain.turns, raw))
        session_list.append(Session(plain.session_id, plain.date, marked, True))
        gold_sessions.append(plain.session_id)
    meta = {"conversation_id": cid, "question_index": k, "category": category, "speakers": list(speakers),
            "evidence": list(evidence), "evidence_raw": list(raw_evidence), "evidence_split": split,
            "evidence_normalised": normalised, "evidence_unresolved": unresolved}
    meta |= {f"upstream_{name}": item[name] for name in ("answer", "adversarial_answer") if name in item}
    return Record(
        record_id=f"{cid}:q{k:04d}",
        question=question + (TEMPORAL_HINT if CATEGORIES[category] == "temporal" else ""),
        answers=(answer_to_str(answer),),
        question_type=CATEGORIES[category],
        question_date=None,
        sessions=tuple(session_list),
        evidence_session_ids=tuple(gold_sessions),
        is_abstention=category == ABSTENTION_CATEGORY,
        source=SOURCE,
        cluster_id=cid,
        raw_answer=answer,
        meta=meta,
    )


def evidence_counts(records) -> dict[str, int]:
    """How the evidence ids of LoCoMo records resolved: questions, with / without gold evidence, ids in masks,
    strings split, ids normalised, ids naming no turn (left out)."""
    locomo = [r for r in records if r.source == SOURCE]
    counts = Counter()
    for r in locomo:
        counts["with_evidence"] += bool(r.meta.get("evidence"))
        for name in ("evidence", "evidence_split", "evidence_normalised", "evidence_unresolved"):
            counts[name] += len(r.meta.get(name, ()))
    return {"questions": len(locomo), "with_evidence": counts["with_evidence"],
            "without_evidence": len(locomo) - counts["with_evidence"], "ids_resolved": counts["evidence"],
            "ids_split": counts["evidence_split"], "ids_normalised": counts["evidence_normalised"],
            "ids_unresolved": counts["evidence_unresolved"]}


def locomo_layout(record: Record, mode: str):
    """The :class:`~relaylens.datasets.spans.PromptLayout` of a LoCoMo record: the head naming both speakers, then per
    session ``DATE: ...`` / ``CONVERSATION:`` and one line per turn (the session span covers its header and turns;
    the head and the blank lines between sessions are framing), then :data:`QA_INSTRUCTION` and the question block
    (the question part: the history of every question over one conversation is the same text)."""
    from relaylens.datasets.prompting import question_block  # noqa: PLC0415 - import cycle: prompting imports the registry
    from relaylens.datasets.spans import PromptLayout  # noqa: PLC0415 - import cycle, as above

    a, b = (record.meta or {}).get("speakers", ("Speaker A", "Speaker B"))
    parts, sessions, turns = [HEAD.format(a=a, b=b)], [], []
    pos = len(parts[0])

    def put(piece: str) -> int:
        nonlocal pos
        parts.append(piece)
        start, pos = pos, pos + len(piece)
        return start

    for session in record.sessions:
        start = put(f"DATE: {session.date}\nCONVERSATION:\n" if session.date is not None else "CONVERSATION:\n")
        for j, turn in enumerate(session.turns):
            if j:
                put("\n")
            turns.append((session, j, put(turn.content), pos))
        sessions.append((session, start, pos))
        put("\n\n")
    q_start = put(QA_INSTRUCTION)
    put(question_block(record, mode))
    return PromptLayout("".join(parts), q_start, tuple(sessions), tuple(turns))


def sniff(path: Path) -> bool:
    """A LoCoMo file: JSON with ``qa``, ``conversation`` and ``speaker_a``."""
    return has_keys(json_head(path), "qa", "conversation", "speaker_a")


FORMAT = DatasetFormat(SOURCE, read_locomo, sniff, layout=locomo_layout)
