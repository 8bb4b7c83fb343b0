"""A seeded generator of tiny InfiniteBench-format records (``longdialogue_qa_eng``, ``longbook_choice_eng``,
``longbook_qa_eng``) so the InfiniteBench analysis and its tests run on a CPU.

Each record is one JSON line in the benchmark's own schema (``id``, ``context``, ``input``, ``answer``, ``options``)
plus a ``task`` key (the benchmark keeps one file per task; the bundled sample interleaves the three tasks in one
file, so each line names its task). Books are generated paragraphs of everyday prose with one planted fact the
question asks about; dialogue scripts are ``NAME: line`` exchanges in which one speaker name is replaced by
``$$MASK$$`` (the answer is that name, upper case, as upstream). Contexts are ~1.5-2.5k SmolLM2 tokens.

Example:
    >>> rows = infinitebench_rows(seed=0, per_task=1)
    >>> [r["task"] for r in rows], "$$MASK$$" in rows[0]["context"], len(rows[1]["options"])
    (['longdialogue_qa_eng', 'longbook_choice_eng', 'longbook_qa_eng'], True, 4)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from relaylens.datasets.infinitebench import bundled_infinitebench_path  # noqa: F401 - the sample this module writes
from relaylens.datasets.synthetic_text import CITIES, FIRST_NAMES, INSTRUMENTS, PET_NAMES, TOPICS, advice_sentences

TASK_ORDER = ("longdialogue_qa_eng", "longbook_choice_eng", "longbook_qa_eng")
LINES = ("I told you the harbor would be closed by now.", "We should have left before the rain.",
         "Nobody listens when the bell rings twice.", "Bring the lantern, the stairs are dark.",
         "I never trusted the man from the mill.", "The letter arrived this morning, unopened.",
         "Keep your voice down, they can hear us.", "You promised to be back before supper.",
         "The horses are restless tonight.", "If the bridge is out, we take the long road.",
         "I found the key under the third stone.", "Do you remember the winter of the flood?")


def _paragraphs(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        topic = rng.choice(TOPICS)
        out.append(" ".join(advice_sentences(rng, topic if isinstance(topic, str) else topic[0], rng.randint(4, 6))))
    return out


def _book(rng: random.Random, fact: str, n: int) -> str:
    paras = _paragraphs(rng, n)
    paras.insert(rng.randrange(1, n), fact)
    return "\n\n".join(paras)


def _dialogue(rng: random.Random, i: int) -> dict:
    names = [n.upper() for n in rng.sample(FIRST_NAMES, 4)]
    lines = [f"{rng.choice(names)}: {rng.choice(LINES)}" for _ in range(110)]
    k = rng.randrange(40, 100)
    speaker = lines[k].split(":")[0]
    lines[k] = "$$MASK$$:" + lines[k].split(":", 1)[1]
    scenes = ["\n".join(lines[a : a + 10]) for a in range(0, len(lines), 10)]
    return {"id": i, "context": "\n\n".join(scenes), "input": "", "answer": [speaker], "options": [],
            "task": "longdialogue_qa_eng"}


def _choice(rng: random.Random, i: int) -> dict:
    hero, city = rng.choice(FIRST_NAMES), rng.choice(CITIES)
    wrong = rng.sample([c for c in CITIES if c != city], 3)
    options = wrong + [city]
    rng.shuffle(options)
    fact = f"In the spring, {hero} packed two bags and moved to {city}, where the old bakery stood by the river."
    return {"id": i, "context": _book(rng, fact, 24), "input": f"Which city did {hero} move to in the spring?",
            "answer": [city], "options": options, "task": "longbook_choice_eng"}


def _qa(rng: random.Random, i: int) -> dict:
    hero, pet, instrument = rng.choice(FIRST_NAMES), rng.choice(PET_NAMES), rng.choice(INSTRUMENTS)
    fact = f"{hero} named the little {instrument}-loving puppy {pet}, after a song from childhood."
    return {"id": i, "context": _book(rng, fact, 24), "input": f"What did {hero} name the puppy?", "answer": [pet],
            "options": [], "task": "longbook_qa_eng"}


def infinitebench_rows(seed: int = 0, per_task: int = 3) -> list[dict]:
    """``per_task`` records of each task, interleaved (dialogue, choice, qa, dialogue, ...), ids unique per task."""
    rng = random.Random(seed)
    rows = []
    for i in range(per_task):
        rows += [_dialogue(rng, i), _choice(rng, i), _qa(rng, i)]
    return rows


def write_infinitebench_sample(path: str | Path | None = None, seed: int = 0, per_task: int = 3) -> Path:
    """Write the sample as JSON lines (stable bytes for a seed)."""
    path = Path(path or bundled_infinitebench_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in infinitebench_rows(seed, per_task))
    path.write_text(text, encoding="utf-8")
    return path
