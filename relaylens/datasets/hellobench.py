"""Reader for HelloBench's summarization file (Quehry/HelloBench ``summarization.jsonl``) with its HelloEval checklists.

One JSON object per line (a JSON array also reads). Fields read:

* ``id`` (str), ``category`` (the source kind: ``blogs``, ``report``, ``news``, ``long_dialogue``,
  ``academic_article``), ``raw_text`` (the source text);
* the prompt: ``chat_prompt`` (else ``instruction``, as HelloBench's result files name it), which must contain
  ``raw_text`` verbatim: the text before it is the task instruction (kept in the history, protected under
  ``--protect-instructions``), the text after it is read as the question part;
* ``checklists``: the item's HelloEval checklist, a non-empty list of yes/no questions, each a string or an object
  ``{"text", "weight", "aspect"}``; ``num_checklist``, when present, must equal its length. An item without
  ``checklists`` gets its category's published checklist (:data:`HELLOEVAL`; ``Record.meta["checklist_from"]`` says
  which was used: ``"item"`` or ``"helloeval"``);
* checklist weights (HelloEval's per-category regression weights): an item's ``checklist_weights`` list, else
  ``checklist_weights.json`` beside the data file (``{category: [weights]}``), else HelloEval's published weights
  of the category when the checklist has their length (``WEIGHT_DICT``, :data:`HELLOEVAL`), else equal weights.
  Weights are positive and finite; the source used is recorded in ``Record.meta["weights_from"]`` (``"item"``,
  ``checklist_weights.json``, ``"helloeval"`` or ``"equal"``).

:data:`HELLOEVAL` is HelloBench's own data, read from ``relaylens/data/helloeval_summarization.json``: the five
categories' checklists (``Checklists/summarization_checklist.json``) and HelloEval's regression weights
(``WEIGHT_DICT`` of ``results/scripts/compute.py``), from github.com/Quehry/HelloBench (the file names the commits).

Everything else (``requirements``, ``text_len``, ``base_prompt``, ...) is kept in ``Record.meta``. Malformed items
raise :class:`~relaylens.errors.RecordError` naming the record id, the field and the fix.

Aspects (what factuality and coverage average over, :mod:`relaylens.scoring.checklist`): an object item's ``aspect``,
else the rule of :func:`checklist_aspect` on the question text.

Example:
    >>> checklist_aspect("Is the summary perfectly accurate without errors or misleading information?")
    'factuality'
    >>> checklist_aspect("Does the summary comprehensively cover all the important information from the blog?")
    'coverage'
    >>> checklist_aspect("Is the summary sufficiently long and complete? ... long enough to cover the key information.")
    'other'
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from relaylens.datasets.common import get_field, iter_json_objects, record_error
from relaylens.datasets.formats import DatasetFormat, has_keys, json_head
from relaylens.datasets.records import Record, RecordCollector, Session, Turn
from relaylens.datasets.spans import PromptLayout
from relaylens.errors import RecordError

CATEGORIES = ("blogs", "report", "news", "long_dialogue", "academic_article")
ASPECTS = ("factuality", "coverage", "other")
WEIGHTS_FILE = "checklist_weights.json"
SOURCE = "hellobench"
HELLOEVAL = json.loads((Path(__file__).resolve().parent.parent / "data" / "helloeval_summarization.json")
                       .read_text("utf-8"))
"""HelloBench's published summarization checklists (``HELLOEVAL["checklists"][category]``) and HelloEval's
regression weights (``HELLOEVAL["weights"][category]``), with their ``source``: the documented defaults."""
_LENGTH = re.compile(r"\b(?:sufficiently|adequately)\s+(?:long|lengthy)\b"
                     r"|\b(?:long|short|brief|lengthy)\s+enough\b|\b(?:too|overly)\s+(?:long|short|brief|lengthy)\b"
                     r"|\blength\b|\bword count\b|\bnumber of words\b")  # a question about the summary's length


def checklist_aspect(text: str) -> str:
    """The aspect an item's question asks about: ``other`` for length ("sufficiently long", "long enough", "length",
    even when it goes on to "cover the key information"), ``factuality`` for accuracy, ``coverage`` for covering
    the source's important information, ``other`` otherwise (readability, requirements, flawless). The question is
    the text up to its first ``?`` (HelloBench items go on to explain it; the explanation does not decide)."""
    low = text.lower()
    question = low[:low.index("?") + 1] if "?" in low else low
    if _LENGTH.search(question):
        return "other"
    if re.search(r"\baccura(te|cy)\b", question):
        return "factuality"
    if re.search(r"\bcover(s|age)?\b", question):
        return "coverage"
    return "other"


def read_hellobench(path: Path, collector: RecordCollector) -> None:
    weights = _weights_file(Path(path).parent / WEIGHTS_FILE)
    for where, obj in iter_json_objects(path):
        if isinstance(obj, dict) and isinstance(obj.get("id"), str):
            where = f"record id {obj['id']!r} ({where})"
        collector.add(where, lambda obj=obj, where=where: parse_item(obj, path, where, weights))


def _weights_file(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        table = json.loads(path.read_text("utf-8"))
    except ValueError as err:
        raise RecordError(f"{path}: not valid JSON ({err}). Fix: write {{category: [weights]}}") from None
    if not isinstance(table, dict):
        raise RecordError(f"{path}: expected an object {{category: [weights]}}, got {type(table).__name__}")
    return table


def parse_item(obj, path, where: str, weights: dict | None = None) -> Record:
    """One HelloBench summarization item as a :class:`Record` (``source="hellobench"``)."""
    if isinstance(obj, RecordError):
        raise obj
    if not isinstance(obj, dict):
        raise record_error(path, where, "<item>", "a JSON object", obj, "each line must be one HelloBench item")
    rid = get_field(obj, "id", str, path, where)
    category = get_field(obj, "category", str, path, where, f"give the source kind, one of {CATEGORIES}")
    text = get_field(obj, "raw_text", str, path, where, "put the source text to summarise in 'raw_text'")
    if not text.strip():
        raise record_error(path, where, "raw_text", "non-empty source text", text, "give the text to summarise")
    key = "chat_prompt" if "chat_prompt" in obj else "instruction"
    prompt = get_field(obj, key, str, path, where, "give the full prompt ('chat_prompt') with the source text in it")
    at = prompt.find(text)
    if at < 0:
        raise record_error(path, where, key, "a prompt that contains 'raw_text' verbatim", prompt[:60],
                           "the prompt must embed the source text unchanged (it is split there into instruction, "
                           "source and question parts)")
    head, tail = prompt[:at], prompt[at + len(text):]
    published = "checklists" not in obj and category in HELLOEVAL["checklists"]
    if published:  # HelloBench's own checklist of the category
        obj = {**obj, "checklists": list(HELLOEVAL["checklists"][category])}
    checklist, weights_from = parse_checklist(obj, path, where, (weights or {}).get(category), with_source=True)
    meta = {k: v for k, v in obj.items() if k not in ("id", "raw_text", "checklists", key)}
    meta.update(category=category, prompt_head=head, prompt_tail=tail, checklist=checklist, weights_from=weights_from,
                checklist_from="helloeval" if published else "item")
    instruction = (head + tail).strip()
    return Record(rid, instruction, (), category, None, (Session("source", None, (Turn("document", text),)),), (),
                  False, source=SOURCE, meta=meta)


def parse_checklist(obj: dict, path, where: str, category_weights=None, with_source: bool = False):
    """``({"text", "weight", "aspect"}, ...)`` of an item, weights resolved (see the module docstring), every field
    checked; with ``with_source``, also where the weights came from (``Record.meta["weights_from"]``)."""
    items = get_field(obj, "checklists", list, path, where, "give the HelloEval checklist as a list of questions")
    if not items:
        raise record_error(path, where, "checklists", "a non-empty list", items, "give at least one checklist question")
    count = obj.get("num_checklist")
    if count is not None and count != len(items):
        raise record_error(path, where, "num_checklist", f"{len(items)} (the checklist's length)", count,
                           "make num_checklist equal the number of checklist items, or drop it")
    weights = obj.get("checklist_weights", category_weights)
    source = "item" if "checklist_weights" in obj else WEIGHTS_FILE if category_weights is not None else "equal"
    published = HELLOEVAL["weights"].get(obj.get("category"))
    if weights is None and published is not None and len(published) == len(items):
        weights, source = list(published), "helloeval"  # HelloEval's regression weights of the category
    if weights is not None and (not isinstance(weights, list) or len(weights) != len(items)):
        field = "checklist_weights" if "checklist_weights" in obj else f"{WEIGHTS_FILE}[{obj.get('category')!r}]"
        raise record_error(path, where, field, f"a list of {len(items)} weights (one per checklist item)", weights,
                           "give one positive weight per checklist item")
    out = []
    for i, item in enumerate(items):
        field = f"checklists[{i}]"
        if isinstance(item, str):
            item = {"text": item}
        if not isinstance(item, dict) or not isinstance(item.get("text"), str) or not item["text"].strip():
            raise record_error(path, where, field, "a question string or {'text', 'weight', 'aspect'}", item,
                               "write the checklist question as text")
        weight = item.get("weight", weights[i] if weights is not None else 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise record_error(path, where, f"{field}.weight", "a positive finite number", weight,
                               "give every checklist item a weight > 0")
        aspect = item.get("aspect", checklist_aspect(item["text"]))
        if aspect not in ASPECTS:
            raise record_error(path, where, f"{field}.aspect", f"one of {ASPECTS}", aspect, "name a known aspect")
        out.append({"text": item["text"], "weight": float(weight), "aspect": aspect})
    for aspect in ("factuality", "coverage"):
        if not any(c["aspect"] == aspect for c in out):
            raise record_error(path, where, "checklists", f"at least one {aspect} item", [c["text"][:40] for c in out],
                               f"add an item about {aspect} or mark one with \"aspect\": \"{aspect}\" (factuality and "
                               "coverage are averaged over those items)")
    return (tuple(out), source) if with_source else tuple(out)


def hellobench_layout(record, mode: str):
    """The :class:`~relaylens.datasets.spans.PromptLayout` of a HelloBench item: the instruction head and the source
    text are the history (the source is one session with one document turn; the head lies outside it, so it is
    protected), the prompt's tail is the question part (completion mode appends a ``Summary:`` cue)."""
    meta = record.meta or {}
    head, tail = meta.get("prompt_head", ""), meta.get("prompt_tail", "")
    session = record.sessions[0]
    text = session.turns[0].content
    if mode == "completion":
        tail = tail + "\n\nSummary:"
    start, end = len(head), len(head) + len(text)
    return PromptLayout(head + text + tail, end, ((session, start, end),), ((session, 0, start, end),))


def bundled_hellobench_path() -> Path:
    """Path of the bundled ``sample_hellobench.jsonl``."""
    return Path(__file__).resolve().parent.parent / "data" / "sample_hellobench.jsonl"


def sniff(path: Path) -> bool:
    """A HelloBench summarization file: JSON with ``raw_text`` and its checklists, chat prompt or category."""
    head = json_head(path)
    return has_keys(head, "raw_text") and any(has_keys(head, key) for key in ("checklists", "chat_prompt", "category"))


FORMAT = DatasetFormat(SOURCE, read_hellobench, sniff, sample=bundled_hellobench_path, layout=hellobench_layout)
