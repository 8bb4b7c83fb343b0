"""Reader for InfiniteBench (OpenBMB/InfiniteBench) ``longdialogue_qa_eng``, ``longbook_choice_eng``,
``longbook_qa_eng``.

JSONL fields: ``id`` (int), ``context``, ``input``, ``answer`` (list of str), ``options`` (list, empty unless
multiple choice). The long context becomes one session of ``"document"`` turns: paragraphs packed into chunks of at
most :data:`CHUNK_CHARS` characters (turn-level spans are then retrievable chunks). Records sharing a book or script
share ``cluster_id`` (a hash of the context). The task comes from ``task=``, else from the file name, else from a
per-record ``task`` key (files that mix tasks, like the bundled sample), else from the content (non-empty options:
``longbook_choice_eng``; ``$$MASK$$`` in the context: ``longdialogue_qa_eng``).

Example:
    >>> chunk_paragraphs("a\\n\\nb", max_chars=10)
    ('a\\n\\nb',)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from relaylens.datasets.common import iter_json_objects, record_error
from relaylens.datasets.formats import DatasetFormat, has_keys, json_head
from relaylens.datasets.prompt_templates import infinitebench_layout
from relaylens.datasets.records import Record, RecordCollector, Session, Turn
from relaylens.errors import RecordError, RelaylensError

TASKS = ("longdialogue_qa_eng", "longbook_choice_eng", "longbook_qa_eng")
"""The InfiniteBench tasks relaylens reads (En.Dia, En.MC, En.QA)."""
CHUNK_CHARS = 2000
#: En.Dia ignores ``input``: the question is always who ``$$MASK$$`` is.
DIALOGUE_QUESTION = 'Which character is "$$MASK$$" in the dialogue above? Answer with the name only.'


def chunk_paragraphs(text: str, max_chars: int = CHUNK_CHARS) -> tuple[str, ...]:
    """Pack blank-line-separated paragraphs into chunks of at most ``max_chars`` (a longer paragraph stays whole)."""
    chunks: list[str] = []
    for para in text.split("\n\n"):
        if chunks and len(chunks[-1]) + 2 + len(para) <= max_chars:
            chunks[-1] = chunks[-1] + "\n\n" + para
        else:
            chunks.append(para)
    return tuple(chunks)


def task_from_name(path: Path) -> str | None:
    hits = [t for t in TASKS if t in path.name]
    return hits[0] if len(hits) == 1 else None


def read_infinitebench(path: Path, collector: RecordCollector, task: str | None = None) -> None:
    if task is not None and task not in TASKS:
        raise RelaylensError(f"unknown InfiniteBench task {task!r}; relaylens reads {TASKS}. Fix: pass task= one of "
                             "those, or leave it out to read the task from the file name")
    task = task or task_from_name(path)
    for where, obj in iter_json_objects(path):
        if isinstance(obj, dict) and "id" in obj:
            where = f"record id {obj['id']!r} ({where})"
        collector.add(where, lambda obj=obj, where=where: parse_record(obj, path, where, task))


def _infer_task(obj: dict, path, where) -> str:
    if obj.get("options"):
        return "longbook_choice_eng"
    if "$$MASK$$" in obj.get("context", ""):
        return "longdialogue_qa_eng"
    raise RecordError(f"{path}: {where}: cannot tell which InfiniteBench task this is (no options, no $$MASK$$). "
                      f"Fix: pass task= one of {TASKS}, or keep the task name in the file name")


def parse_record(obj, path, where: str, task: str | None) -> Record:
    if isinstance(obj, Exception):
        raise obj
    if not isinstance(obj, dict):
        raise record_error(path, where, "<record>", "a JSON object", obj, "each line is one JSON object")
    for key, types in (("id", (int, str)), ("context", (str,)), ("input", (str,)), ("answer", (list, str))):
        if not isinstance(obj.get(key), types):
            raise record_error(path, where, key, " or ".join(t.__name__ for t in types), obj.get(key),
                               f"InfiniteBench records carry {key!r}")
    if obj.get("task") is not None and obj["task"] not in TASKS:
        raise record_error(path, where, "task", f"one of {TASKS}", obj["task"], "name the record's InfiniteBench task")
    task = task or obj.get("task") or _infer_task(obj, path, where)
    answers = obj["answer"] if isinstance(obj["answer"], list) else [obj["answer"]]
    if not answers or not all(isinstance(a, str) for a in answers):
        raise record_error(path, where, "answer", "a non-empty list of strings", obj["answer"], "list the gold answers")
    options = correct = None
    question = obj["input"]
    if task == "longbook_choice_eng":
        raw = obj.get("options")
        if not isinstance(raw, list) or len(raw) < 2 or not all(isinstance(o, str) for o in raw):
            raise record_error(path, where, "options", "a list of option strings", raw, "give the 4 options")
        if len(raw) > 4:  # the official En.MC scoring (relaylens.scoring.metrics) reads the letters A-D only
            raise record_error(path, where, "options", "at most 4 options (En.MC is scored on the letters A-D)",
                               f"{len(raw)} options", "keep the 4 options of the task")
        if answers[0] not in raw:
            raise record_error(path, where, "answer", f"one of the options {raw}", answers[0],
                               "answer[0] must be the correct option's exact text")
        idx = raw.index(answers[0])
        options = tuple(f"{chr(65 + i)}. {o}" for i, o in enumerate(raw))
        correct = chr(97 + idx)
    elif task == "longdialogue_qa_eng":
        if "$$MASK$$" not in obj["context"]:  # the question asks who $$MASK$$ is: without it there is no answer
            raise record_error(path, where, "context", "a dialogue script with the $$MASK$$ placeholder (En.Dia asks "
                               "which character it hides)", obj["context"][:80], "keep the $$MASK$$ of the record")
        question = DIALOGUE_QUESTION
    if not question.strip():
        raise record_error(path, where, "input", "a non-empty question", question, "fill in the question")
    context = obj["context"]
    turns = tuple(Turn("document", c) for c in chunk_paragraphs(context))
    return Record(
        record_id=f"{task}_{obj['id']}", question=question, answers=tuple(answers), question_type=task,
        question_date=None, sessions=(Session("context", None, turns),), evidence_session_ids=(),
        is_abstention=False, options=options, correct_option=correct, source="infinitebench",
        cluster_id=hashlib.sha1(context.encode("utf-8")).hexdigest()[:12], raw_answer=obj["answer"],
        meta={"task": task, "id": obj["id"], "input": obj["input"]},
    )


def bundled_infinitebench_path() -> Path:
    """Path of the bundled ``sample_infinitebench.jsonl`` (3 records per task)."""
    return Path(__file__).resolve().parent.parent / "data" / "sample_infinitebench.jsonl"


def sniff(path: Path) -> bool:
    """An InfiniteBench task file: a task name in the file name, or JSON with ``context`` and ``input``."""
    head = json_head(path)
    return head is not None and (any(task in path.name for task in TASKS) or has_keys(head, "context", "input"))


FORMAT = DatasetFormat("infinitebench", read_infinitebench, sniff, sample=bundled_infinitebench_path,
                       layout=infinitebench_layout)
