"""Prompt rendering: a :class:`~relaylens.datasets.records.Record` as history tokens, question tokens and unit spans.

Layout (LongMemEval reader prompt, ``src/generation/run_generation.py``)::

    I will give you several history chats ... chat history.\\n\\n\\nHistory Chats:\\n\\n
    \\n### Session 1:\\nSession Date: 2023/05/20 (Sat) 02:21\\nSession Content:\\n{body}\\n     (one block per session)
    \\n\\nCurrent Date: 2023/05/30 (Tue) 23:40\\nQuestion: ...\\nAnswer:                    (the question block)

Sessions are sorted by date string (stable; records without dates keep file order) and numbered from 1; a
session without a date omits its ``Session Date:`` line and a record without ``question_date`` omits
``Current Date:``. Multiple-choice options follow the question, one per line.

* ``history_format="nl"`` (default): ``body`` is ``"\\n\\n{role}: {content.strip()}"`` per turn, the content stripped
  as upstream's ``nl`` format does (``"document"`` turns print the stripped content alone). We default to ``nl``
  rather than upstream's recommended ``json``: small models read plain speaker lines better, JSON escaping
  inflates token counts, and a turn's tokens are then exactly its own text.
* ``history_format="json"``: ``body`` is ``"\\n" + json.dumps([{"role", "content"}...])`` as upstream.
* ``mode="chat"``: the whole text is one user message inside the model's chat template (with the generation
  prompt); the question part is the question block + template tail + generation prompt. Greedy decoding stops at
  EOS only (:data:`STOP_ON_NEWLINE`).
* ``mode="completion"``: plain text, no template (BOS prepended when the tokenizer adds one), ending
  ``Short answer:``; decoding stops at the first newline.
* InfiniteBench records (``source == "infinitebench"``) use the benchmark's own task templates instead of this
  layout: :mod:`relaylens.datasets.prompt_templates`.

Tokenisation: the full prompt is tokenised **once** with offsets; ``history_ids + question_ids`` is exactly that
tokenisation. The split is the first token whose character range ends after the question block starts: a token
straddling the boundary (a merge across the ``\\n\\n`` separator) goes to the question part, so the history never
holds a token that also covers question text. Span token ranges are every token overlapping the unit's characters.
Gold annotations (``has_answer``, session ids, ``answer_session_ids``) never reach the text.

Example:
    >>> from relaylens.testing import tiny_tokenizer
    >>> from relaylens.datasets.records import Record, Session, Turn
    >>> rec = Record("q1", "What is my dog called?", ("Biscuit",), "single-session-user", "2023/05/30 (Tue) 23:40",
    ...              (Session("s1", "2023/05/20 (Sat) 02:21", (Turn("user", "My dog is Biscuit.", True),), True),),
    ...              ("s1",), False)
    >>> p = render_prompt(rec, tiny_tokenizer(), mode="completion")
    >>> p.question_text
    'Current Date: 2023/05/30 (Tue) 23:40\\nQuestion: What is my dog called?\\nShort answer:'
    >>> p.turns[0].is_evidence, p.history_text[p.history_text.index("user:"):].startswith("user: My dog")
    (True, True)
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from itertools import accumulate

from relaylens.datasets import prompt_layout
from relaylens.datasets.records import Record, Session
from relaylens.datasets.spans import PromptLayout, RenderedPrompt, Span
from relaylens.errors import RecordError, RelaylensError
from relaylens.model.tokens import encode_data_text

INSTRUCTION = ("I will give you several history chats between you and a user. "
               "Please answer the question based on the relevant chat history.")
HISTORY_HEADER = "\n\n\nHistory Chats:\n\n"
MODES = ("chat", "completion")
HISTORY_FORMATS = ("nl", "json")
ANSWER_CUE = {"chat": "Answer:", "completion": "Short answer:"}
CHAT_ROLES = ("user", "assistant", "system")
#: Whether greedy generation stops at the first newline, per mode (chat stops at EOS only).
STOP_ON_NEWLINE = {"chat": False, "completion": True}


def ordered_sessions(record: Record) -> list[Session]:
    """Sessions in prompt order: sorted by date string (stable) when every session has a date."""
    sessions = list(record.sessions)
    if sessions and all(s.date is not None for s in sessions):
        sessions.sort(key=lambda s: s.date)
    return sessions


def question_block(record: Record, mode: str = "chat") -> str:
    """``Current Date: ...\\nQuestion: ...\\n[options\\n]Answer:`` (``Short answer:`` in completion mode)."""
    _check(mode, MODES, "mode")
    lines = []
    if record.question_date is not None:
        lines.append(f"Current Date: {record.question_date}")
    lines.append(f"Question: {record.question}")
    lines.extend(record.options or ())
    lines.append(ANSWER_CUE[mode])
    return "\n".join(lines)


def layout_prompt(record: Record, mode: str = "chat", history_format: str = "nl") -> PromptLayout:
    """The prompt text of ``record`` (no chat template, no tokenizer) with unit character ranges."""
    _check(history_format, HISTORY_FORMATS, "history_format")
    parts = [INSTRUCTION, HISTORY_HEADER]
    pos = len(INSTRUCTION) + len(HISTORY_HEADER)
    sessions, turns = [], []

    def put(piece: str) -> int:
        nonlocal pos
        parts.append(piece)
        start, pos = pos, pos + len(piece)
        return start

    for i, session in enumerate(ordered_sessions(record), start=1):
        put("\n")
        s_start = put(f"### Session {i}:\n")
        if session.date is not None:
            put(f"Session Date: {session.date}\n")
        put("Session Content:\n")
        if history_format == "nl":
            for j, turn in enumerate(session.turns):
                put("\n\n")
                content = turn.content.strip()  # upstream's nl format strips each turn's content
                t_start = put(content if turn.role not in CHAT_ROLES else f"{turn.role}: {content}")
                turns.append((session, j, t_start, pos))
        else:
            put("\n[")
            for j, turn in enumerate(session.turns):
                if j:
                    put(", ")
                t_start = put(json.dumps({"role": turn.role, "content": turn.content}))
                turns.append((session, j, t_start, pos))
            put("]")
        sessions.append((session, s_start, pos))
        put("\n")
    put("\n\n")
    q_start = put(question_block(record, mode))
    return PromptLayout("".join(parts), q_start, tuple(sessions), tuple(turns))


def render_prompt(record: Record, tokenizer, mode: str = "chat", history_format: str = "nl") -> RenderedPrompt:
    """Render ``record`` for ``tokenizer`` (a fast Hugging Face tokenizer); see the module docstring for the layout.

    Returns a :class:`~relaylens.datasets.spans.RenderedPrompt` whose ``history_ids`` ``[L]`` and ``question_ids``
    ``[Q]`` concatenate to the joint tokenisation of ``history_text + question_text``.
    """
    import torch  # noqa: PLC0415 - torch-free room: token ids as tensors; importing the datasets stage itself imports no torch

    _check(mode, MODES, "mode")
    if not any(session.turns for session in record.sessions):
        raise RecordError(f"record {record.record_id!r} has an empty history ({len(record.sessions)} sessions, no "
                          "turns); there is nothing to cache or select. Fix: drop the record or give it at least one "
                          "session with a turn")

    own_layout = prompt_layout(record)  # the format's own prompt (InfiniteBench's templates, HelloBench's task head)
    layout = own_layout(record, mode) if own_layout is not None else layout_prompt(record, mode, history_format)
    if mode == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise RelaylensError(f"tokenizer {type(tokenizer).__name__} has no chat template. Fix: use "
                                 "mode='completion'")
        full = tokenizer.apply_chat_template([{"role": "user", "content": layout.text}], tokenize=False,
                                             add_generation_prompt=True)
        offset = full.rfind(layout.text)
        if offset < 0:
            raise RelaylensError("the chat template changed the user message text (e.g. trimmed or escaped it), so "
                                 "history spans cannot be located. Fix: use mode='completion' or a template that "
                                 "keeps content")
    else:
        prefix = _bos_prefix(tokenizer)
        full, offset = prefix + layout.text, len(prefix)
    if not getattr(tokenizer, "is_fast", False):
        raise RelaylensError(f"{type(tokenizer).__name__} is not a fast tokenizer; offsets need a *Fast tokenizer. "
                             "Fix: load it with AutoTokenizer.from_pretrained(..., use_fast=True) (the default)")
    ids, offsets = encode_data_text(tokenizer, full, offset, offset + len(layout.text))
    starts = list(accumulate((s for s, _ in offsets), max))  # [T] non-decreasing
    ends = list(accumulate((e for _, e in offsets), max))  # [T]
    q_char = offset + layout.question_start
    split = bisect_right(ends, q_char)  # first token ending after the question block starts
    if split == 0 or split >= len(ids):
        raise RecordError(f"record {record.record_id!r}: the prompt has no history or no question tokens. Fix: give "
                          "the record a non-empty history and question")
    split_char = min(starts[split], q_char)

    def token_range(a: int, b: int) -> tuple[int, int]:
        lo = bisect_right(ends, offset + a)
        hi = bisect_left(starts, offset + b)
        return min(lo, split), min(max(hi, lo), split)

    session_spans = []
    for k, (session, a, b) in enumerate(layout.sessions):
        lo, hi = token_range(a, b)
        session_spans.append(Span("session", k, session.session_id, lo, hi, session.is_evidence, None, session.text))
    turn_spans = []
    for k, (session, j, a, b) in enumerate(layout.turns):
        turn = session.turns[j]
        lo, hi = token_range(a, b)
        turn_spans.append(Span("turn", k, session.session_id, lo, hi, turn.has_answer, turn.role, turn.content))
    return RenderedPrompt(
        record_id=record.record_id,
        history_ids=torch.tensor(ids[:split], dtype=torch.long),  # [L]
        question_ids=torch.tensor(ids[split:], dtype=torch.long),  # [Q]
        history_text=full[:split_char],
        question_text=full[split_char:],
        question=record.question,
        sessions=tuple(session_spans),
        turns=tuple(turn_spans),
        mode=mode,
        text_start=min(bisect_right(ends, offset), split),
    )


def _bos_prefix(tokenizer) -> str:
    """The BOS token text when the tokenizer adds one by default (Llama), else ``""`` (SmolLM2, Qwen2)."""
    bos = getattr(tokenizer, "bos_token", None)
    if bos is None:
        return ""
    with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
    without = tokenizer("a", add_special_tokens=False)["input_ids"]
    return bos if len(with_special) > len(without) and with_special[0] == tokenizer.bos_token_id else ""


def _check(value: str, allowed: tuple[str, ...], name: str) -> None:
    if value not in allowed:
        raise RelaylensError(f"{name} must be one of {allowed}; got {value!r}. Fix: pass {name}= one of those")
