"""Reader for PersonaMem v1 (bowen-upenn/PersonaMem): ``questions_{32k,128k,1M}.csv`` + ``shared_contexts_*.jsonl``.

Each CSV row is one multiple-choice question over a prefix of a shared context: the visible history is
``context[:int(end_index_in_shared_context)]``. Each ``system`` message (``"Current user persona: ..."``) opens a
new session; speaker prefixes inside contents ("User: ...") are kept. ``all_options`` is one string holding a
Python list repr, parsed with :func:`ast.literal_eval`; ``correct_answer`` like ``"(c)"`` becomes
``correct_option="c"`` and ``answers=(the "(c) ..." option,)``. Question types are normalised through
:data:`TYPE_ALIASES`. PersonaMem has no turn-level gold: ``distance_to_ref_*`` columns go to ``meta``.

Example:
    >>> TYPE_ALIASES["recalling_facts_mentioned_by_the_user"]
    'recall_user_shared_facts'
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

from relaylens.datasets.common import peek_text, record_error
from relaylens.datasets.formats import DatasetFormat
from relaylens.datasets.records import Record, RecordCollector, Session, Turn
from relaylens.errors import RecordError

SKILLS = (
    "recall_user_shared_facts",
    "suggest_new_ideas",
    "acknowledge_latest_user_preferences",
    "track_full_preference_evolution",
    "revisit_reasons_behind_preference_updates",
    "provide_preference_aligned_recommendations",
    "generalize_to_new_scenarios",
)
#: Old and variant question-type names found in released CSVs -> the 7 canonical skills.
TYPE_ALIASES = {
    **{s: s for s in SKILLS},
    "recalling_facts_mentioned_by_the_user": "recall_user_shared_facts",
    "recalling_the_reasons_behind_previous_updates": "revisit_reasons_behind_preference_updates",
    "generalizing_to_new_scenarios": "generalize_to_new_scenarios",
    "suggesting_new_ideas": "suggest_new_ideas",
    "acknowledging_latest_user_preferences": "acknowledge_latest_user_preferences",
    "tracking_full_preference_evolution": "track_full_preference_evolution",
    "providing_preference_aligned_recommendations": "provide_preference_aligned_recommendations",
}
REQUIRED_COLUMNS = ("question_id", "question_type", "correct_answer", "all_options", "shared_context_id",
                    "end_index_in_shared_context")
QUESTION_COLUMNS = ("user_question_or_message", "question")
_META_COLUMNS = ("topic", "persona_id", "context_length_in_tokens", "context_length_in_letters",
                 "distance_to_ref_in_blocks", "distance_to_ref_in_tokens", "num_irrelevant_tokens",
                 "distance_to_ref_proportion_in_context", "stereotypical")
#: The option letters the scoring rules read (``relaylens.scoring.metrics``: a-d).
OPTION_LETTERS = "abcd"
_LETTER = re.compile(r"^\s*\(?\s*([a-zA-Z])\s*\)")


def default_contexts_path(questions_path: Path) -> Path:
    """``questions_32k.csv`` -> ``shared_contexts_32k.jsonl`` in the same folder."""
    name = questions_path.name.replace("questions", "shared_contexts", 1)
    return questions_path.with_name(Path(name).with_suffix(".jsonl").name)


def read_personamem(path: Path, collector: RecordCollector, contexts_path: str | Path | None = None) -> None:
    """Parse the questions CSV at ``path`` (and its shared contexts) into ``collector``."""
    import pandas as pd  # noqa: PLC0415 - import cost: pandas loads on first use

    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise  # load_records_with_report names the byte and the fix
    except ValueError as exc:  # pandas: ParserError, EmptyDataError
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise RecordError(f"{path}: not a readable CSV file ({type(exc).__name__}: {first}). Fix: pass the "
                          "PersonaMem questions_*.csv as downloaded (re-download it if a transfer was cut "
                          "short)") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    qcol = next((c for c in QUESTION_COLUMNS if c in frame.columns), None)
    if missing or qcol is None:
        need = missing + ([] if qcol else ["user_question_or_message (or question)"])
        raise RecordError(f"{path}: header: expected PersonaMem question columns {REQUIRED_COLUMNS} plus a question "
                          f"column; missing {need}. Fix: pass the questions_*.csv file, or format= for another dataset")
    ctx_path = Path(contexts_path) if contexts_path is not None else default_contexts_path(path)
    if not ctx_path.exists():
        raise FileNotFoundError(f"{path}: the shared contexts file {ctx_path} does not exist. Fix: put "
                                f"shared_contexts_*.jsonl beside the CSV or pass contexts_path=")
    contexts = load_contexts(ctx_path, set(frame["shared_context_id"]))
    for n, row in enumerate(frame.to_dict("records"), start=2):  # CSV line 1 is the header
        where = f"question {row.get('question_id', '')!r} (row at line {n})"
        collector.add(where, lambda row=row, where=where: parse_row(row, qcol, contexts, path, ctx_path, where))


def load_contexts(path: Path, wanted: set[str]) -> dict[str, list]:
    """``{shared_context_id: messages}`` for the ids in ``wanted`` (other lines are not parsed)."""
    out = {}
    key_re = re.compile(r'^\s*\{\s*"([^"]+)"')
    with open(path, encoding="utf-8-sig") as fh:
        for n, line in enumerate(_decoded(fh, path), start=1):
            m = key_re.match(line)
            if not m or m.group(1) not in wanted:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise RecordError(f"{path}: line {n}: not valid JSON ({err.msg}). Fix: each line must be "
                                  '{"<shared_context_id>": [messages]}') from None
            except RecursionError:
                raise RecordError(f"{path}: line {n}: JSON nested too deeply to read. Fix: each line must be "
                                  '{"<shared_context_id>": [messages]}') from None
            if not isinstance(obj, dict) or len(obj) != 1:
                raise RecordError(f"{path}: line {n}: expected one object with a single key (the shared context id). "
                                  'Fix: each line must be {"<shared_context_id>": [messages]}')
            ((cid, messages),) = obj.items()
            out[cid] = messages
    return out


def _decoded(lines, path):
    try:
        yield from lines
    except UnicodeDecodeError as err:
        raise RecordError(f"{path}: not UTF-8 text ({err.reason} at byte offset {err.start} of a read block). Fix: "
                          "re-encode the file as UTF-8") from None


def parse_options(text: str, path, where: str) -> tuple[str, ...]:
    """``"['(a) x', '(b) y']"`` -> ``("(a) x", "(b) y")``; unlabelled options get ``(a) ``.. prefixes."""
    try:
        options = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise record_error(path, where, "all_options", "a Python list repr of option strings", text,
                           "write all_options as e.g. \"['(a) ...', '(b) ...', '(c) ...', '(d) ...']\"") from None
    if not isinstance(options, (list, tuple)) or len(options) < 2 or not all(isinstance(o, str) for o in options):
        raise record_error(path, where, "all_options", "a list of at least 2 strings", options,
                           "list the options as strings")
    if len(options) > len(OPTION_LETTERS):
        raise record_error(path, where, "all_options", f"at most {len(OPTION_LETTERS)} options (scoring reads the "
                           f"letters {'-'.join(OPTION_LETTERS[::len(OPTION_LETTERS) - 1])})", f"{len(options)} options",
                           "keep the four PersonaMem options")
    out = []
    for i, opt in enumerate(options):
        m = _LETTER.match(opt)
        if m and m.group(1).lower() not in OPTION_LETTERS:
            raise record_error(path, where, f"all_options[{i}]", "an option labelled (a)-(d)", opt,
                               "label the options (a) to (d)")
        out.append(opt.strip() if m else f"({OPTION_LETTERS[i]}) {opt.strip()}")
    return tuple(out)


def parse_row(row: dict, qcol: str, contexts: dict, path, ctx_path, where: str) -> Record:
    qtype_raw = row["question_type"].strip()
    if qtype_raw not in TYPE_ALIASES:
        raise record_error(path, where, "question_type", f"a PersonaMem skill or alias ({sorted(TYPE_ALIASES)})",
                           qtype_raw, "add the alias to relaylens.datasets.personamem.TYPE_ALIASES")
    options = parse_options(row["all_options"], path, where)
    m = _LETTER.match(row["correct_answer"]) or re.fullmatch(r"\s*([a-zA-Z])\s*", row["correct_answer"])
    letters = [_LETTER.match(o).group(1).lower() for o in options]
    if not m or m.group(1).lower() not in letters:
        raise record_error(path, where, "correct_answer", f"an option letter like '(c)' among {letters}",
                           row["correct_answer"], "write the correct option as '(x)'")
    correct = m.group(1).lower()
    cid = row["shared_context_id"]
    if cid not in contexts:
        raise record_error(path, where, "shared_context_id", f"an id present in {ctx_path}", cid,
                           "use the shared_contexts file of the same size as the questions file")
    raw_end = row["end_index_in_shared_context"]
    try:
        value = float(raw_end)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not value.is_integer():  # "2.9" is not silently cut to 2; inf/nan refused
        raise record_error(path, where, "end_index_in_shared_context", "a whole number of messages", raw_end,
                           "write the message count as an integer")
    end = int(value)
    messages = contexts[cid]
    if not isinstance(messages, list):
        raise record_error(ctx_path, f"context {cid!r}", "<messages>", "a list of messages", messages,
                           'each line must be {"<shared_context_id>": [messages]}')
    if not 0 < end <= len(messages):
        raise record_error(path, where, "end_index_in_shared_context", f"an index in 1..{len(messages)}", end,
                           "the index must cut inside the shared context")
    question = row[qcol]
    if not question.strip():
        raise record_error(path, where, qcol, "a non-empty question", question, "fill in the question text")
    return Record(
        record_id=row["question_id"],
        question=question,
        answers=(options[letters.index(correct)],),
        question_type=TYPE_ALIASES[qtype_raw],
        question_date=None,
        sessions=split_sessions(messages[:end], cid, ctx_path),
        evidence_session_ids=(),
        is_abstention=False,
        options=options,
        correct_option=correct,
        source="personamem",
        cluster_id=row.get("persona_id") or cid,
        raw_answer=row["correct_answer"],
        meta={"shared_context_id": cid, "end_index_in_shared_context": end, "question_type_raw": qtype_raw,
              **{c: row[c] for c in _META_COLUMNS if c in row}},
    )


def split_sessions(messages: list, cid: str, ctx_path) -> tuple[Session, ...]:
    """Cut a message list into sessions at each ``system`` message (which opens its session)."""
    sessions: list[list[Turn]] = []
    for j, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "user",
                                                                "assistant") or not isinstance(msg.get("content"), str):
            raise record_error(ctx_path, f"context {cid[:12]}...", f"[{j}]",
                               "a {role: system|user|assistant, content: str} message",
                               msg, "repair the shared context message")
        if msg["role"] == "system" or not sessions:
            sessions.append([])
        sessions[-1].append(Turn(msg["role"], msg["content"]))
    return tuple(Session(f"{cid[:12]}_{k}", None, tuple(turns)) for k, turns in enumerate(sessions))


def sniff(path: Path) -> bool:
    """A PersonaMem questions file: a CSV whose header names ``shared_context_id`` and ``correct_answer``."""
    if path.suffix != ".csv":
        return False
    header = peek_text(path, 1 << 16).split("\n", 1)[0]
    return "shared_context_id" in header and "correct_answer" in header


FORMAT = DatasetFormat("personamem", read_personamem, sniff)
