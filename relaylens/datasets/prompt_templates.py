"""InfiniteBench's own prompt templates, one per task, split at the context into history and question parts.

Source: OpenBMB/InfiniteBench ``src/prompt.py``. The task format is used verbatim (these strings are the benchmark's
input format, not prose of ours): ``mode="chat"`` uses the chat-model set (``gpt4_templates``, the text becomes one
user message of the model's chat template), ``mode="completion"`` the base-model set (``yarn_mistral_templates``,
which ends in an answer cue such as ``The letter of the correct answer is``). Everything up to and including
``{context}`` is the history; the rest (question, options, instructions, cue) is the question part, so the
compressed cache holds the document and the question is read in full after it.

The context is the record's ``"document"`` turns joined by blank lines, which rebuilds the original context exactly
(the reader split it at blank lines); each turn is a span, the whole context one session span. Fields:
``{question}`` is the record's ``input`` (``longbook_qa_eng``, ``longbook_choice_eng``), ``{OPTION_A}..{OPTION_D}``
the four option texts; ``longdialogue_qa_eng`` has no question field (the question is fixed by the template).

Example:
    >>> from relaylens.datasets.records import Record, Session, Turn
    >>> rec = Record("longbook_qa_eng_0", "Who?", ("Ann",), "longbook_qa_eng", None,
    ...              (Session("context", None, (Turn("document", "Ann sailed."),)),), (), False,
    ...              source="infinitebench", meta={"task": "longbook_qa_eng", "input": "Who sailed?"})
    >>> layout = infinitebench_layout(rec, "completion")
    >>> layout.history_text
    'Read the book and answer the question. Be very concise in your answer.\\n\\nAnn sailed.'
    >>> layout.text[layout.question_start:]
    '\\n\\nQuestion: Who sailed?\\nAnswer:'
"""

from __future__ import annotations

from relaylens.datasets.spans import PromptLayout
from relaylens.errors import RecordError

#: chat-model templates (InfiniteBench ``gpt4_templates``)
CHAT_TEMPLATES = {
    "longbook_qa_eng": "Read the book below and answer a question.\n\n{context}\n\nQuestion: {question}\n\nBe very "
                       "concise.",
    "longbook_choice_eng": (
        "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\n\nOnly one of the following "
        "options is correct, tell me the answer using one single letter (A, B, C, or D). Don't say anything else.\n"
        "A. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}"
    ),
    "longdialogue_qa_eng": (
        "Below is a dialogue script where one random occurrence of a character name is replaced with \"$$MASK$$\", and "
        "you should try to guess who that character is.\n\nThe dialogue:\n\n---\n\n{context}\n\n---\n\nEnd of dialogue."
        "\n\nWhich character is most likely \"$$MASK$$\"? Just say the name used by the scriptwriter (before the colon "
        "marks) of one single character and nothing else."
    ),
}

#: base-model templates with an answer cue (InfiniteBench ``yarn_mistral_templates``)
COMPLETION_TEMPLATES = {
    "longbook_qa_eng": "Read the book and answer the question. Be very concise in your "
                       "answer.\n\n{context}\n\nQuestion: {question}\nAnswer:",
    "longbook_choice_eng": (
        "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\nA. {OPTION_A}\nB. {OPTION_B}\n"
        "C. {OPTION_C}\nD. {OPTION_D}\n\nThe letter of the correct answer is"
    ),
    "longdialogue_qa_eng": (
        "Below is a dialogue script where one random occurrence of a character name is replaced with \"$$MASK$$\", and "
        "you should try to guess who that character is.\n\n{context}\n\nThe name that has been replaced with $$MASK$$ "
        "is likely"
    ),
}

TEMPLATES = {"chat": CHAT_TEMPLATES, "completion": COMPLETION_TEMPLATES}


def infinitebench_task(record) -> str:
    """The InfiniteBench task of a record read by :mod:`relaylens.datasets.infinitebench`."""
    task = (record.meta or {}).get("task") or record.question_type
    if task not in CHAT_TEMPLATES:
        raise RecordError(f"record {record.record_id!r}: InfiniteBench task {task!r} has no prompt template; relaylens "
                          f"renders {sorted(CHAT_TEMPLATES)}")
    return task


def template_fields(record, task: str) -> dict[str, str]:
    """The question-side fields of ``task``'s template for ``record`` (everything but ``{context}``)."""
    if task == "longdialogue_qa_eng":
        return {}
    question = (record.meta or {}).get("input", record.question)
    fields = {"question": question}
    if task == "longbook_choice_eng":
        options = record.options or ()
        if len(options) != 4:
            raise RecordError(f"record {record.record_id!r}: InfiniteBench multiple choice needs 4 options for its "
                              f"template (A-D); got {len(options)}. Fix: give exactly four options")
        # the reader displays options as "A. text": the template adds its own letters
        fields.update({f"OPTION_{chr(65 + i)}": o[3:] if o[1:3] == ". " else o for i, o in enumerate(options)})
    return fields


def infinitebench_layout(record, mode: str):
    """The :class:`~relaylens.datasets.spans.PromptLayout` of an InfiniteBench record under its task's template."""

    task = infinitebench_task(record)
    template = TEMPLATES[mode][task]
    head, tail = template.split("{context}")
    if "{" in head:
        raise RecordError(f"{task}: the template has fields before the context; relaylens cannot split it")
    parts, turns = [head], []
    pos = len(head)
    session = record.sessions[0]
    if len(record.sessions) != 1:
        raise RecordError(f"record {record.record_id!r}: an InfiniteBench record has one context session; got "
                          f"{len(record.sessions)}")
    for j, turn in enumerate(session.turns):
        if j:
            parts.append("\n\n")
            pos += 2
        parts.append(turn.content)
        turns.append((session, j, pos, pos + len(turn.content)))
        pos += len(turn.content)
    sessions = ((session, len(head), pos),)
    question = tail.format(**template_fields(record, task))
    return PromptLayout("".join(parts) + question, pos, sessions, tuple(turns))
