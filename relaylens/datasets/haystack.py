"""LongMemEval-S-like haystacks built from the LongMemEval oracle: each question's own evidence sessions, filled to a
target history length with whole sessions of *other* questions.

**What this is, plainly.** An S-like construction from the oracle, not LongMemEval-S (which relaylens cannot
obtain). LongMemEval-S puts a question's evidence sessions among ~50 sessions (~115k Llama-3.1 tokens) drawn from
other users' simulated sessions and from ShareGPT / UltraChat, filtered against the question's attribute. Here:

* the filler sessions are the evidence sessions of the oracle's *other* 499 questions (real user-assistant chats of
  the same simulated-user style, but every one of them is some question's evidence: topically denser than S's
  ShareGPT / UltraChat share);
* a filler is never drawn when it mentions the question's answer string (case-insensitive, as a whole word or
  phrase: ``3`` does not match ``2023``); S instead excludes simulated sessions whose attribute conflicts. Nothing
  else about the filler's content is checked (a filler may touch the question's topic without its answer). For a
  bare small-number answer (``2``, ``3``) nearly every oracle session mentions it (numbered lists), so such
  questions can fill only shorter targets; a question whose answer-free fillers cannot reach the target within one
  session is left out and counted (``underfilled``), never built short;
* the question's evidence sessions stay together, in their date order with their own dates, as one block at a
  seeded depth (uniform over [0, 1] per record: the share of the filler tokens placed before the block); S scatters
  evidence sessions among the fillers by date;
* the fillers get new dates: before the block, going back from the first evidence date by 1 hour to 3 days each;
  after it, spread between the last evidence date and the question date (stepped forward by minutes when the oracle
  dates its evidence at or after the question);
* filler session ids are renamed ``filler_<original id without answer_>`` (upstream tools treat an id containing
  ``answer`` as gold) and lose their ``has_answer`` labels, as S's sampler strips them;
* the length is counted with the run's tokenizer on the history exactly as relaylens renders it
  (:func:`relaylens.datasets.prompting.layout_prompt`, completion layout: instruction, header and session blocks),
  not S's ``json.dumps`` length under Llama-3.1's tokenizer.

Gold evidence is kept at both levels: ``has_answer`` on the evidence turns (turn level) and ``answer_session_ids``
naming the evidence sessions (session level), so ``RenderedPrompt.evidence_mask("turn")`` and
``evidence_mask("session")`` mark exactly the question's own evidence.

**Length.** Each candidate session's token cost is counted once (as a one-session history minus the empty one); a
record is filled by walking a seeded shuffle of the candidates and adding every session that still fits under the
target, then the finished history is tokenised once and, when the estimate overshot, fillers are removed until it
fits: the history never exceeds the target and ends within one session of it. Questions whose evidence alone takes
more than ``max_evidence_share`` (default 0.9) of the target are left out and counted; naming such a question
explicitly (``question_ids``) is an error. Deterministic: the same oracle, tokenizer, target and seed give the same
bytes (``.gz`` output is written with no name or time in the gzip header).

Each output record is a LongMemEval record (sessions sorted by date, as S) with one extra key,
``relaylens_haystack``: target and measured history tokens, the seed, the target depth, the measured depth of the
evidence block (start and end, as shares of the history tokens), and the filler count; loaders keep it in
``Record.meta``.

Example:
    >>> oracle = [_example(f"q{k}", answer=f"answer{k}", sessions=3) for k in range(6)]
    >>> built = build_haystacks(oracle, tokens=600, seed=0)
    >>> rec = built.records[0]
    >>> rec["answer_session_ids"], len(rec["haystack_sessions"]) > 3
    (['answer_q0_1', 'answer_q0_2', 'answer_q0_3'], True)
    >>> rec["relaylens_haystack"]["history_tokens"] <= 600
    True
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import tempfile
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from relaylens.datasets.common import LME_DATE_FORMAT
from relaylens.datasets.longmemeval import parse_record
from relaylens.datasets.prompting import HISTORY_FORMATS, layout_prompt
from relaylens.datasets.records import answer_to_str
from relaylens.errors import RecordError, RelaylensError, shown

FILLER_PREFIX = "filler_"
CONSTRUCTION = "relaylens S-like haystack from the LongMemEval oracle (not LongMemEval-S)"


@dataclass(frozen=True)
class HaystackSpec:
    """How haystacks are built.

    Attributes:
        tokens: target history length in the run's tokens (the rendered history, completion layout).
        seed: seed of the filler draw, the depth and the filler dates.
        max_evidence_share: a question whose evidence alone takes more than this share of ``tokens`` is left out.
        history_format: ``nl`` (relaylens's default rendering) or ``json`` (upstream's), as the run renders.
    """

    tokens: int
    seed: int = 0
    max_evidence_share: float = 0.9
    history_format: str = "nl"

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, int) or self.tokens < 1:
            raise RelaylensError(f"haystack tokens must be a positive integer; got {self.tokens!r}. Fix: pass the "
                                 "target history length, e.g. --tokens 8192")
        if not 0 < self.max_evidence_share <= 1:
            raise RelaylensError(f"max_evidence_share must be in (0, 1]; got {self.max_evidence_share!r}. Fix: pass "
                                 "e.g. 0.9 (evidence may fill at most 90% of the target)")
        if self.history_format not in HISTORY_FORMATS:
            raise RelaylensError(f"history_format must be one of {HISTORY_FORMATS}; got {self.history_format!r}")


class _Underfilled(Exception):
    """Too few other sessions leave out the question's answer to fill the history within one session."""

    def __init__(self, reached: int) -> None:
        super().__init__(reached)
        self.reached = reached


@dataclass(frozen=True)
class HaystackBuild:
    """What :func:`build_haystacks` made.

    Attributes:
        records: LongMemEval records (dicts, the file's schema), in oracle order.
        left_out: ``(question_id, evidence tokens)`` of each question whose evidence does not fit.
        spec: the settings used.
        underfilled: ``(question_id, tokens reached)`` of each question left out because too few other sessions
            leave its answer unmentioned to reach the target within one session (answers such as ``2`` or ``3``:
            nearly every oracle session has a numbered list).
        seconds: wall time of the build.
    """

    records: list[dict]
    left_out: tuple[tuple[str, int], ...]
    spec: HaystackSpec
    underfilled: tuple[tuple[str, int], ...] = ()
    seconds: float = field(default=0.0, compare=False)

    def summary(self) -> str:
        """One line: how many questions were built and left out, at which target."""
        n = len(self.records) + len(self.left_out) + len(self.underfilled)
        return (f"{len(self.records)} of {n} questions built at {self.spec.tokens} history tokens (seed "
                f"{self.spec.seed}); {len(self.left_out)} left out (evidence alone over "
                f"{self.spec.max_evidence_share:.0%} of the target), {len(self.underfilled)} left out (too few other "
                f"sessions without the answer to fill the target); {self.seconds:.1f} s")


@dataclass
class _Pool:
    """Every distinct session of the oracle once, with its token cost as a history block."""

    ids: list[str]
    dates: list[str]
    sessions: list[list[dict]]
    owners: list[set[str]]  # question ids whose evidence the session is
    lowered: list[str]  # turn contents joined, lower case (for the answer check)
    cost: list[int]
    index: dict[str, int] = field(default_factory=dict)  # session id -> position


def build_haystacks(oracle: str | os.PathLike | Sequence[dict] | None = None, tokens: int = 8192, seed: int = 0,
                    tokenizer=None, question_ids: Sequence[str] | None = None, max_evidence_share: float = 0.9,
                    history_format: str = "nl") -> HaystackBuild:
    """S-like haystacks from the LongMemEval oracle (see the module docstring for the construction).

    Args:
        oracle: the oracle file (default: the pulled ``longmemeval-oracle``,
            :func:`relaylens.datasets.real_data.real_data_path`) or its records as dicts.
        tokens: target history length; ``seed``: the draw's seed.
        tokenizer: the run's tokenizer (a Hugging Face tokenizer or a ``str -> int`` counter); None: the
            approximate counter of :mod:`relaylens.datasets.synthetic` (no model).
        question_ids: build only these questions (each must fit, else an error naming it); None: every question
            that fits.
        max_evidence_share: the share of ``tokens`` the evidence alone may take.
        history_format: the run's history format (``nl`` or ``json``).
    """
    t0 = time.perf_counter()
    spec = HaystackSpec(tokens, seed, max_evidence_share, history_format)
    raw, where = _oracle_records(oracle)
    counter = _Counter(tokenizer)
    parsed = [parse_record(obj, where, f"record {obj.get('question_id')!r} (item {k})")
              for k, obj in enumerate(raw)]
    by_id = {rec.record_id: k for k, rec in enumerate(parsed)}
    wanted = list(question_ids) if question_ids is not None else None
    twice = next((q for k, q in enumerate(wanted or ()) if q in wanted[:k]), None)
    if twice is not None:
        raise RecordError(f"question {shown(twice)!r} is asked for twice. Fix: name each question once")
    for qid in wanted or ():
        if qid not in by_id:
            raise RecordError(f"question {shown(qid)!r} is not in {where}. Fix: pass a question_id of the oracle")
    chosen = [by_id[q] for q in wanted] if wanted is not None else list(range(len(raw)))
    pool = _pool(raw, parsed, counter, history_format)
    empty = counter.many([_history_text(_header_only(raw[0]), history_format)])[0]
    # evidence alone: estimated from the session costs; counted exactly where it may fit (the estimate is within a
    # few tokens, so a 3% margin decides the rest)
    own = [empty + sum(pool.cost[pool.index[sid]] for sid in raw[k]["haystack_session_ids"]) for k in chosen]
    near = [j for j, est in enumerate(own) if est <= 1.03 * spec.max_evidence_share * spec.tokens]
    exact = counter.many([_history_text(_evidence_only(raw[chosen[j]]), history_format) for j in near])
    for j, n in zip(near, exact):
        own[j] = n
    records, left_out, underfilled = [], [], []
    for k, evidence_tokens in zip(chosen, own):
        qid = parsed[k].record_id
        if evidence_tokens > spec.max_evidence_share * spec.tokens:
            if wanted is not None:
                raise RecordError(f"question {shown(qid)!r}: its evidence sessions alone take {evidence_tokens} "
                                  f"tokens, over {spec.max_evidence_share:.0%} of the {spec.tokens}-token target. "
                                  f"Fix: ask for at least {int(evidence_tokens / spec.max_evidence_share) + 1} "
                                  "tokens, or leave the question out")
            left_out.append((qid, evidence_tokens))
            continue
        try:
            records.append(_build_one(raw[k], parsed[k], pool, spec, evidence_tokens, counter))
        except _Underfilled as short:
            if wanted is not None:
                raise RecordError(f"question {shown(qid)!r}: only {short.reached} of {spec.tokens} history tokens "
                                  "can be filled: too few other sessions leave its answer "
                                  f"{shown(answer_to_str(raw[k]['answer']))!r} unmentioned. Fix: ask for fewer "
                                  "tokens, or leave the question out") from None
            underfilled.append((qid, short.reached))
    return HaystackBuild(records, tuple(left_out), spec, underfilled=tuple(underfilled),
                         seconds=time.perf_counter() - t0)


def write_haystacks(build: HaystackBuild, path: str | os.PathLike) -> Path:
    """Write the records as one JSON array (indent 1, UTF-8, stable bytes), atomically; ``.gz``: gzip with no name
    or time in the header. Returns the path."""
    path = Path(path)
    data = (json.dumps(build.records, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
    if path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=9, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's file is private (0600); the output is an ordinary data file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def haystack_command(tokens: int, seed: int, tokenizer, out: str | os.PathLike, oracle=None,
                     question_ids: Sequence[str] | None = None, max_evidence_share: float = 0.9,
                     history_format: str = "nl") -> tuple[Path, HaystackBuild]:
    """``relaylens data haystack --tokens N --seed S [--model SPEC] --out FILE``: build and write; returns the
    written path and the build (its :meth:`HaystackBuild.summary` is what the CLI prints)."""
    build = build_haystacks(oracle, tokens, seed, tokenizer, question_ids, max_evidence_share, history_format)
    if not build.records:
        raise RelaylensError(f"no question fits {tokens} history tokens ({len(build.left_out)} left out: their "
                             f"evidence alone is over {max_evidence_share:.0%} of the target). Fix: ask for more "
                             "tokens")
    return write_haystacks(build, out), build


def question_ids_of(path: str | os.PathLike) -> list[str]:
    """The ``question_id`` of every record of a LongMemEval-format file (``.json`` or ``.json.gz``), in file order:
    ``--questions-from`` builds a second history length on the same questions."""
    raw, where = _oracle_records(Path(path))
    ids = [r.get("question_id") for r in raw]
    bad = next((i for i, q in enumerate(ids) if not isinstance(q, str) or not q), None)
    if bad is not None:
        raise RecordError(f"{where}: record {bad} has no question_id string. Fix: pass a LongMemEval-format file "
                          "(e.g. one written by relaylens data haystack)")
    return ids


# ---------------------------------------------------------------------------------------------------- internals


def _oracle_records(oracle) -> tuple[list[dict], str]:
    if oracle is None:
        from relaylens.datasets.real_data import real_data_path  # noqa: PLC0415 - same room; the cache is read late

        oracle = real_data_path("longmemeval-oracle")
    if isinstance(oracle, (str, os.PathLike)):
        path = Path(oracle)
        opener = gzip.open if path.name.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8") as fh:
                raw = json.load(fh)
        except (OSError, ValueError) as exc:
            raise RecordError(f"{path}: cannot read the oracle as a JSON array ({type(exc).__name__}: "
                              f"{shown(str(exc)[:200])}). Fix: pass the LongMemEval oracle file (relaylens data pull "
                              "longmemeval-oracle)") from None
        where = str(path)
    else:
        raw, where = list(oracle), "<oracle records>"
    if not isinstance(raw, list) or not raw or not all(isinstance(r, dict) for r in raw):
        raise RecordError(f"{where}: expected a non-empty JSON array of LongMemEval records. Fix: pass the "
                          "LongMemEval oracle (relaylens data pull longmemeval-oracle)")
    return raw, where


class _Counter:
    """Token counts with the run's tokenizer (no special tokens added): a Hugging Face tokenizer counts in batches
    and finds prefix lengths from one tokenisation's offsets; any other counter counts each text."""

    def __init__(self, tokenizer) -> None:
        self.hf = tokenizer if tokenizer is not None and hasattr(tokenizer, "encode") and callable(tokenizer) else None
        if self.hf is None:
            from relaylens.datasets.synthetic import make_token_counter  # noqa: PLC0415 - the generator's counter

            self.one = make_token_counter(tokenizer)

    def many(self, texts: list[str]) -> list[int]:
        """The token count of each text."""
        if self.hf is None:
            return [self.one(t) for t in texts]
        out = []
        for a in range(0, len(texts), 64):
            out += [len(ids) for ids in self.hf(texts[a:a + 64], add_special_tokens=False)["input_ids"]]
        return out

    def marked(self, text: str, marks: tuple[int, ...]) -> tuple[int, list[int]]:
        """``(tokens of text, [tokens before each character mark])``."""
        if self.hf is None:
            total, *before = self.many([text] + [text[:m] for m in marks])
            return total, before
        offsets = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        starts = [a for a, _ in offsets]
        return len(offsets), [bisect_left(starts, m) for m in marks]


def _record_dict(src: dict, ids: list[str], dates: list[str], sessions: list[list[dict]], evidence: list[str]) -> dict:
    return {"question_id": src["question_id"], "question_type": src["question_type"], "question": src["question"],
            "answer": src["answer"], "question_date": src["question_date"], "haystack_session_ids": ids,
            "haystack_dates": dates, "haystack_sessions": sessions, "answer_session_ids": evidence}


def _history_text(obj: dict, history_format: str) -> str:
    rec = parse_record(obj, "<haystack>", f"record {obj['question_id']!r}")
    return layout_prompt(rec, "completion", history_format).history_text


def _header_only(src: dict) -> dict:
    return _record_dict(src, [], [], [], [])


def _evidence_only(src: dict) -> dict:
    order = sorted(range(len(src["haystack_session_ids"])), key=lambda i: src["haystack_dates"][i])
    return _record_dict(src, [src["haystack_session_ids"][i] for i in order], [src["haystack_dates"][i] for i in order],
                        [src["haystack_sessions"][i] for i in order], list(src["answer_session_ids"]))


def _pool(raw: list[dict], parsed, counter: _Counter, history_format: str) -> _Pool:
    """Every distinct session once (first occurrence), with the questions it is evidence for and its cost."""
    pool = _Pool([], [], [], [], [], [])
    index: dict[str, int] = {}
    for obj, rec in zip(raw, parsed):
        for sid, date, turns in zip(obj["haystack_session_ids"], obj["haystack_dates"], obj["haystack_sessions"]):
            if sid in index:
                pool.owners[index[sid]].add(rec.record_id)
                continue
            index[sid] = len(pool.ids)
            pool.ids.append(sid)
            pool.index[sid] = index[sid]
            pool.dates.append(date)
            pool.sessions.append([{"role": t["role"], "content": t["content"]} for t in turns])
            pool.owners.append({rec.record_id})
            pool.lowered.append("\n".join(t["content"] for t in turns).lower())
    header = raw[0]
    texts = [_history_text(_record_dict(header, [FILLER_PREFIX + "x"], [d], [s], []), history_format)
             for d, s in zip(pool.dates, pool.sessions)]
    empty = counter.many([_history_text(_header_only(header), history_format)])[0]
    pool.cost = [c - empty for c in counter.many(texts)]
    return pool


def _mentions(answer: str) -> Callable[[str], bool]:
    """Whether a lower-cased text mentions ``answer`` as a whole word or phrase (case-insensitive)."""
    needle = answer.strip().lower()
    if not needle:
        return lambda text: False
    pattern = re.compile(r"(?<!\w)" + re.escape(needle) + r"(?!\w)")
    return lambda text: needle in text and pattern.search(text) is not None


def _build_one(src: dict, rec, pool: _Pool, spec: HaystackSpec, evidence_tokens: int, counter: _Counter) -> dict:
    qid = rec.record_id
    rng = random.Random(f"relaylens-haystack:{spec.seed}:{qid}")
    depth = rng.random()
    own_ids = set(src["haystack_session_ids"])
    mentions = _mentions(answer_to_str(src["answer"]))
    order = list(range(len(pool.ids)))
    rng.shuffle(order)
    smallest = min(pool.cost) if pool.cost else 0
    budget = spec.tokens - evidence_tokens
    fillers: list[int] = []
    for i in order:
        if budget < smallest:
            break
        if pool.cost[i] > budget or pool.ids[i] in own_ids or qid in pool.owners[i] or mentions(pool.lowered[i]):
            continue
        fillers.append(i)
        budget -= pool.cost[i]
    used = set(fillers)
    if budget >= _median(pool.cost) and not any(  # every answer-free session is used and a typical one still fits
            i not in used and pool.ids[i] not in own_ids and qid not in pool.owners[i]
            and not mentions(pool.lowered[i]) for i in order):
        raise _Underfilled(spec.tokens - budget)
    while True:
        obj, placed = _layout(src, pool, fillers, depth, rng.getstate(), spec)
        text, starts = placed
        total, (before, through) = counter.marked(text, starts)
        if total <= spec.tokens or not fillers:
            break
        over = total - spec.tokens  # the estimate overshot: drop the filler closest above the excess
        fillers.remove(min(fillers, key=lambda i: (pool.cost[i] < over, abs(pool.cost[i] - over))))
    if total > spec.tokens:
        raise RecordError(f"question {shown(qid)!r}: its evidence alone renders to {total} tokens, over the "
                          f"{spec.tokens}-token target. Fix: ask for more tokens")
    obj["relaylens_haystack"] = {
        "construction": CONSTRUCTION,
        "target_tokens": spec.tokens,
        "history_tokens": total,
        "evidence_tokens": evidence_tokens,
        "seed": spec.seed,
        "target_depth": round(depth, 6),
        "evidence_depth": round(before / total, 6),
        "evidence_end_depth": round(through / total, 6),
        "fillers": len(fillers),
        "history_format": spec.history_format,
    }
    return obj


def _median(values: list[int]) -> int:
    return sorted(values)[len(values) // 2] if values else 0


def _layout(src: dict, pool: _Pool, fillers: list[int], depth: float, state, spec: HaystackSpec):
    """The record with fillers placed around the evidence block (block at ``depth`` of the filler tokens) and
    dated; returns it and ``(history text, (evidence start char, evidence end char))``."""
    rng = random.Random()
    rng.setstate(state)  # the dates depend on the seed and the fillers, not on how often this ran
    total = sum(pool.cost[i] for i in fillers)
    before: list[int] = []
    acc = 0
    for i in fillers:  # draw order: the first fillers go before the block until their share passes the depth
        if acc + pool.cost[i] / 2 > depth * total:
            break
        before.append(i)
        acc += pool.cost[i]
    after = fillers[len(before):]
    ev = _evidence_only(src)
    ev_dates = [datetime.strptime(d, LME_DATE_FORMAT) for d in ev["haystack_dates"]]
    qdate = datetime.strptime(src["question_date"], LME_DATE_FORMAT)
    when: dict[int, datetime] = {}
    t = ev_dates[0]
    for i in reversed(before):  # nearest the block first, going back in time
        t = t - timedelta(minutes=rng.randint(60, 3 * 24 * 60))
        when[i] = t
    span = int((qdate - ev_dates[-1]).total_seconds() // 60)
    if span > len(after) + 1:
        minutes = sorted(rng.sample(range(1, span), len(after)))
    else:  # evidence dated at or just before the question: step forward
        minutes, m = [], 0
        for _ in after:
            m += rng.randint(1, 30)
            minutes.append(m)
    for i, m in zip(after, minutes):
        when[i] = ev_dates[-1] + timedelta(minutes=m)
    ids, dates, sessions = [], [], []
    for i in before:
        ids.append(FILLER_PREFIX + pool.ids[i].removeprefix("answer_"))
        dates.append(when[i].strftime(LME_DATE_FORMAT))
        sessions.append(pool.sessions[i])
    ids += ev["haystack_session_ids"]
    dates += ev["haystack_dates"]
    sessions += ev["haystack_sessions"]
    for i in after:
        ids.append(FILLER_PREFIX + pool.ids[i].removeprefix("answer_"))
        dates.append(when[i].strftime(LME_DATE_FORMAT))
        sessions.append(pool.sessions[i])
    obj = _record_dict(src, ids, dates, sessions, list(src["answer_session_ids"]))
    obj.update({k: v for k, v in src.items() if k not in obj})
    layout = layout_prompt(parse_record(obj, "<haystack>", f"record {src['question_id']!r}"), "completion",
                           spec.history_format)
    spans = [(a, b) for session, a, b in layout.sessions if session.is_evidence]
    return obj, (layout.history_text, (min(a for a, _ in spans), max(b for _, b in spans)))


def _example(qid: str, answer: str, sessions: int) -> dict:
    """A small oracle-shaped record (doctest and tests): ``sessions`` evidence sessions of three turns."""
    ids = [f"answer_{qid}_{k + 1}" for k in range(sessions)]
    return {
        "question_id": qid, "question_type": "multi-session", "question": f"What did I say about {qid}?",
        "answer": answer, "question_date": "2023/05/30 (Tue) 23:40", "haystack_session_ids": ids,
        "haystack_dates": [f"2023/05/{10 + k:02d} (Wed) 10:0{k}" for k in range(sessions)],
        "haystack_sessions": [[{"role": "user", "content": f"Note {k} on {qid}: it is {answer}.", "has_answer": True},
                               {"role": "assistant", "content": f"Noted, {qid} item {k}."},
                               {"role": "user", "content": "Thanks, that is all for now.", "has_answer": False}]
                              for k in range(sessions)],
        "answer_session_ids": ids,
    }
