"""A generated HelloBench-format summarization sample (``relaylens/data/sample_hellobench.jsonl``): the demo and CPU
tests of the summarization analysis.

Two items per source kind (blogs, report, news, long_dialogue, academic_article), one per length stratum (short
~700 words, long ~1,400 words; the paper's strata are 4,096-8,000 and 8,000-11,046 tokens). Each source is advice
filler around a handful of planted facts (names, places, numbers) that a faithful summary should carry. Each item has
the benchmark's fields (``id``, ``category``, ``raw_text``, ``chat_prompt`` embedding the text between
``[Text Start]:`` and ``[Text End]``, ``requirements``, ``text_len``, ``checklists``, ``num_checklist``) plus
relaylens's ``checklist_weights`` (generated, not HelloEval's regression weights) and ``length_stratum``. The
checklist questions are our own wording of the five HelloEval summarization aspects (readability, length, accuracy,
coverage, instruction requirements, overall).

Example:
    >>> rows = hellobench_rows(seed=0)
    >>> len(rows), sorted({r["category"] for r in rows})[:2], rows[0]["raw_text"] in rows[0]["chat_prompt"]
    (10, ['academic_article', 'blogs'], True)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from relaylens.datasets.hellobench import CATEGORIES, bundled_hellobench_path  # noqa: F401 - the sample this module writes
from relaylens.datasets.synthetic_text import CITIES, FIRST_NAMES, TOPICS, advice_sentences

KIND = {"blogs": "blog post", "report": "report", "news": "news article", "long_dialogue": "dialogue",
        "academic_article": "academic article"}
ROLE = {"blogs": "an editor", "report": "an analyst", "news": "a journalist", "long_dialogue": "a meeting secretary",
        "academic_article": "a professional researcher"}
STRATA = {"short": 5, "long": 10}  # paragraphs (about 140 words each)


def _checklist(category: str) -> list[str]:
    kind = KIND[category]
    return [
        f"Is every part of the summary easy to follow for a reader who has not seen the {kind}?",
        f"Is the summary long enough to carry the key information of a {kind} of this length?",
        f"Is the summary accurate, stating nothing that contradicts or goes beyond the original {kind}?",
        f"Does the summary cover all the important points of the original {kind}, including its names, places "
        "and figures?",
        "Does the summary meet every requirement of the user instruction?",
        "Is the summary free of any flaw that leaves room for improvement?",
    ]


def _facts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        who, city = rng.choice(FIRST_NAMES), rng.choice(CITIES)
        number = rng.randint(12, 980)
        out.append(rng.choice([
            f"{who} reported that {number} households in {city} joined the programme during the first year.",
            f"According to {who}, the budget for the {city} office grew to {number} thousand euros.",
            f"In {city}, {who} counted {number} volunteers at the spring meeting.",
        ]))
    return out


def _source(rng: random.Random, category: str, paragraphs: int) -> str:
    facts = _facts(rng, max(2, paragraphs // 2))
    paras = []
    for k in range(paragraphs):
        topic = rng.choice(TOPICS)
        body = advice_sentences(rng, topic if isinstance(topic, str) else topic[0], rng.randint(6, 8))
        if k < len(facts):
            body.insert(rng.randrange(len(body) + 1), facts[k])
        paras.append(" ".join(body))
    if category == "long_dialogue":
        speakers = rng.sample(FIRST_NAMES, 3)
        return "\n".join(f"{speakers[k % 3]}: {p}" for k, p in enumerate(paras))
    return "\n\n".join(paras)


def _item(rng: random.Random, category: str, stratum: str, index: int) -> dict:
    text = _source(rng, category, STRATA[stratum])
    kind = KIND[category]
    instruction = (f"You are {ROLE[category]}. Summarize the following {kind} in a few paragraphs, keeping its main "
                   "points, names and figures.")
    requirements = ["The summary should be faithful to the text.", "The summary should cover its key points."]
    prompt = (f"{instruction}\n[Text Start]: \n{text}\n[Text End]\n[Requirements]:\n"
              + "\n".join(f"{i}. {r}" for i, r in enumerate(requirements, 1)))
    checklist = _checklist(category)
    weights = [round(rng.uniform(5.0, 30.0), 3) for _ in checklist]
    return {"id": f"summarization_{index:03d}", "category": category, "raw_text": text, "chat_prompt": prompt,
            "requirements": requirements, "text_len": len(text.split()), "length_stratum": stratum,
            "checklists": checklist, "num_checklist": len(checklist), "checklist_weights": weights}


def hellobench_rows(seed: int = 0) -> list[dict]:
    """Ten items: every category in the short stratum, then every category in the long stratum."""
    rng = random.Random(seed)
    rows = []
    for stratum in STRATA:
        for category in CATEGORIES:
            rows.append(_item(rng, category, stratum, len(rows)))
    return rows


def write_hellobench_sample(path: str | Path | None = None, seed: int = 0) -> Path:
    """Write the sample as JSON lines (stable bytes for a seed)."""
    path = Path(path or bundled_hellobench_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in hellobench_rows(seed)), encoding="utf-8")
    return path
