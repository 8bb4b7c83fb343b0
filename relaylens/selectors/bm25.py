"""BM25 unit retrieval: rank the history's sessions (or turns) against the question text and keep whole units.

The only selector that reads the question (as text; the question is not in the history). Follows
xiaowu0162/LongMemEval ``src/retrieval/run_retrieval.py`` in spirit with a pinned library and settings:
``bm25s`` (Lucene variant: IDF ``ln(1 + (N - df + .5)/(df + .5))``, never negative, and no constant ``k1 + 1``
factor in the term weight) with ``k1 = 1.5``, ``b = 0.75`` and a lowercase ``\\w+`` word tokeniser
applied identically to the question and the units (no stopwords, no stemming). ``reference/selectors.md`` §2 BM25.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import torch

from relaylens.datasets.spans import RenderedPrompt, Span
from relaylens.errors import BudgetError, RecordError, RelaylensError, ShapeError
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult
from relaylens.selectors.base import Budget, Selector, resolve_budget
from relaylens.selectors.streaming import uniform_selection

GRANULARITIES = ("auto", "session", "turn")
AUTO_RULE = ("auto: whole sessions when one fits the budget, else whole turns, else the top-ranked turn cut to the "
             "budget (per record)")
"""What ``granularity="auto"`` (the default) does, in the words the run's manifest records (``regime.bm25_units``)."""
PACKINGS = ("first_fit", "truncate")
INDEXED_TEXTS = ("all", "user")
_WORD = re.compile(r"\w+")


def word_tokens(text: str) -> list[str]:
    """Lowercase ``\\w+`` words (one-character words kept). ``word_tokens("My dog's name?") == ['my', 'dog', 's',
    'name']``."""
    return _WORD.findall(text.lower())


def bm25_scores(query: str, documents: list[str], k1: float = 1.5, b: float = 0.75) -> torch.Tensor:
    """BM25 (bm25s, Lucene variant) score of every document for the query, ``[n_docs]`` float32.

    Example:
        >>> bm25_scores("my dog", ["my dog is Biscuit", "cats are nice", "dog dog walk"]).gt(0).tolist()
        [True, False, True]
    """
    import bm25s  # noqa: PLC0415 - import cost: bm25s loads on first use

    corpus = [word_tokens(d) for d in documents]
    query_tokens = word_tokens(query)
    if not query_tokens or not any(corpus):
        return torch.zeros(len(documents), dtype=torch.float32)
    retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
    retriever.index(corpus, show_progress=False)
    return torch.as_tensor(retriever.get_scores(query_tokens), dtype=torch.float32)


@dataclass(frozen=True)
class BM25(Selector):
    """Greedy first-fit of whole units, ranked by BM25 score (ties: the more recent unit first), into ``K`` tokens.

    The kept set is the union of the chosen units' token spans, identical for every layer and head; each state's
    score is its unit's BM25 score. With ``packing="first_fit"`` (default, the reference retrieval packing) a unit
    that does not fit is skipped and the next one tried, so a long top-ranked session can be lost while shorter,
    lower-ranked ones are kept. With ``packing="truncate"`` the first unit that crosses the budget is cut to the
    remaining room instead (a session keeps its best-scoring turns, ranked by the turn-level BM25 score, whole while
    they fit, then the leading tokens of the next one; a turn keeps its leading tokens) and packing stops: the
    top-ranked units are never skipped.

    Parameters:
        granularity: ``"auto"`` (default), ``"session"`` or ``"turn"`` (``prompt.sessions`` / ``prompt.turns``
            spans). ``"auto"`` ranks whole sessions when at least one session fits the budget (LongMemEval's
            session retrieval, e.g. the paper's 8,192-token budget on LongMemEval-S) and falls back to turns when
            none does (10% of a real history, 150-200 tokens, holds no 1,500-2,000-token session: session
            granularity would skip every such record as ``too_short``); when not even a whole turn fits (10% of a
            history under about 3,000 tokens), it keeps the top-ranked turn cut to the budget (``packing="truncate"``
            for that record, named in ``info["packing"]``). The rule is applied per record; the
            selection's ``info["granularity"]`` names the granularity used and ``info["granularity_rule"]`` the one
            asked for, and the run's manifest records the rule (``config.spec.regime.bm25_units``).
        indexed_text: ``"all"`` (the whole unit's text, default) or ``"user"`` (user turns only, as LongMemEval's
            retrieval; assistant turns then score 0 at turn granularity).
        k1, b: BM25 parameters, pinned at 1.5 and 0.75.
        fill_zero_score: let units with score 0 fill leftover budget (most recent first); default True.
        keep_prefix: force-keep the tokens before the first unit (system prompt / instructions), counted in ``K``;
            default False. Their score is ``1 + max`` unit score.
        packing: ``"first_fit"`` (whole units only) or ``"truncate"`` (see above).

    Example:
        >>> from relaylens.selectors.synthetic import random_prefill
        >>> from relaylens.datasets.spans import RenderedPrompt, Span
        >>> units = tuple(Span("session", i, f"s{i}", 10 * i, 10 * i + 10, False, None, t)
        ...               for i, t in enumerate(["my dog Biscuit", "the weather", "dog food"]))
        >>> prompt = RenderedPrompt("r", torch.zeros(30, dtype=torch.long), torch.zeros(2, dtype=torch.long), "", "",
        ...                         "What is my dog called?", units, ())
        >>> sel = BM25(fill_zero_score=False).select(random_prefill(length=30, window=8), prompt, 20)
        >>> sel.info["units_kept"], sel.counts.unique().tolist(), sel.info["granularity"]
        ([0, 2], [20], 'session')
    """

    granularity: str = "auto"
    indexed_text: str = "all"
    k1: float = 1.5
    b: float = 0.75
    fill_zero_score: bool = True
    keep_prefix: bool = False
    packing: str = "first_fit"

    name: ClassVar[str] = "bm25"
    needs_prompt: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.k1 < 0 or not 0.0 <= self.b <= 1.0:
            raise RelaylensError(f"selector 'bm25': k1 must be >= 0 and b in [0, 1]; got k1={self.k1!r}, b={self.b!r}. "
                                 "Fix: e.g. bm25:k1=1.5,b=0.75")
        if self.granularity not in GRANULARITIES:
            raise RelaylensError(f"BM25 granularity must be one of {GRANULARITIES}; got {self.granularity!r}")
        if self.indexed_text not in INDEXED_TEXTS:
            raise RelaylensError(f"BM25 indexed_text must be one of {INDEXED_TEXTS}; got {self.indexed_text!r}")
        if self.packing not in PACKINGS:
            raise RelaylensError(f"BM25 packing must be one of {PACKINGS}; got {self.packing!r}")

    def protected_request(self, source_budget: int, protected: int) -> int:
        """BM25 keeps only unit tokens (source), so it packs the source budget itself, unless ``keep_prefix``."""
        return source_budget + protected if self.keep_prefix else source_budget

    def resolve_granularity(self, prompt: RenderedPrompt, k: int) -> str:
        """The granularity :meth:`select` ranks for this prompt and a budget of ``k`` tokens: ``self.granularity``,
        or for ``"auto"`` ``"session"`` when a whole session fits into the room the budget leaves for units (after
        the prefix when ``keep_prefix``) or the prompt has no turn spans to fall back to, else ``"turn"``.

        Example (sessions of 10 tokens, turns of 5):
            >>> from relaylens.datasets.spans import Span
            >>> ses = tuple(Span("session", i, f"s{i}", 10 * i, 10 * i + 10, False, None, "x") for i in range(3))
            >>> turns = tuple(Span("turn", i, f"s{i // 2}", 5 * i, 5 * i + 5, False, "user", "x") for i in range(6))
            >>> prompt = RenderedPrompt("r", torch.zeros(30, dtype=torch.long), torch.zeros(2, dtype=torch.long),
            ...                         "", "", "q", ses, turns)
            >>> BM25().resolve_granularity(prompt, 12), BM25().resolve_granularity(prompt, 6)
            ('session', 'turn')
        """
        if self.granularity != "auto":
            return self.granularity
        if not prompt.sessions or not prompt.turns:
            return "session" if prompt.sessions else "turn"
        prefix = min(u.start for u in prompt.sessions) if self.keep_prefix else 0
        return "session" if min(u.length for u in prompt.sessions) <= k - prefix else "turn"

    def unit_texts(self, prompt: RenderedPrompt, units: tuple[Span, ...]) -> list[str]:
        """The text indexed for each unit (``units``: the prompt's sessions or its turns)."""
        if self.indexed_text == "all":
            return [u.text for u in units]
        if units and units[0].kind == "turn":
            return [u.text if u.role == "user" else "" for u in units]
        if not prompt.turns:
            raise RecordError(f"record {prompt.record_id}: indexed_text='user' needs turn spans, but the prompt has "
                              "none")
        user = {}
        for t in prompt.turns:
            if t.role == "user":
                user.setdefault(t.session_id, []).append(t.text)
        return ["\n".join(user.get(u.session_id, [])) for u in units]

    def select(self, prefill: PrefillResult, prompt: RenderedPrompt | None = None,
               budget: Budget | float | int | str = 0.10) -> Selection:
        if prompt is None:
            raise RecordError("BM25 needs the rendered prompt (its unit spans and question); got prompt=None")
        length = prefill.history_length
        if prompt.history_length != length:
            raise ShapeError(f"prompt history has {prompt.history_length} tokens but the prefill has {length}")
        k = resolve_budget(budget, length)
        granularity = self.resolve_granularity(prompt, k)
        units = prompt.units(granularity)
        if not units:
            raise RecordError(
                f"record {prompt.record_id} has no {granularity} spans; use the granularity the prompt was "
                f"rendered with (sessions: {len(prompt.sessions)}, turns: {len(prompt.turns)})"
            )
        for u in units:
            if not 0 <= u.start < u.end <= length:
                raise ShapeError(f"record {prompt.record_id}: {u.kind} {u.index} span [{u.start}, {u.end}) is outside "
                                 f"[0, {length})")
        scores = bm25_scores(prompt.question, self.unit_texts(prompt, units), self.k1, self.b)  # [n_units]
        prefix = min(u.start for u in units) if self.keep_prefix else 0
        capacity = k - prefix
        if capacity < 0:
            raise BudgetError(f"BM25 budget K={k} is smaller than the force-kept {prefix}-token prefix; raise the "
                              "budget")
        order = sorted(range(len(units)), key=lambda i: (-float(scores[i]), -units[i].start))  # score, then recency
        packing = self.packing
        if self.granularity == "auto" and granularity == "turn" and min(u.length for u in units) > capacity:
            packing = "truncate"  # auto's last resort: no whole turn fits (a short history's 10%), so cut the best one
        chosen, used, partial = [], 0, []
        for i in order:
            if scores[i] <= 0 and not self.fill_zero_score:
                continue
            if used + units[i].length <= capacity:
                chosen.append(i)
                used += units[i].length
            elif packing == "truncate":
                partial = self._truncated(prompt, units[i], capacity - used)  # [(start, end)] within the unit
                if partial:
                    chosen.append(i)
                break
        if not chosen and prefix == 0:
            if not self.fill_zero_score and not bool((scores > 0).any()):
                raise RecordError(
                    f"record {prompt.record_id}: no {granularity} shares a word with the question and "
                    "fill_zero_score=False, so BM25 keeps nothing; allow zero-score units or check the question text"
                )
            shortest = min(u.length for u in units)
            fix = ("raise the budget or use packing=truncate (bm25:packing=truncate)" if granularity == "turn" else
                   "raise the budget or use turn granularity (bm25:granularity=turn)")
            raise BudgetError(
                f"BM25 budget K={k} tokens fits no whole {granularity} (the shortest has {shortest} tokens); {fix}"
            )
        state_scores = torch.full((length,), float("nan"))
        if prefix:
            state_scores[:prefix] = float(scores.max()) + 1.0
        for i in chosen:
            spans = partial if partial and i == chosen[-1] else [(units[i].start, units[i].end)]
            for start, end in spans:
                state_scores[start:end] = scores[i]
        keep = torch.nonzero(~torch.isnan(state_scores)).flatten()  # [m] sorted
        info = {
            "selector": self.name,
            "budget": k,
            "granularity": granularity,
            "granularity_rule": self.granularity,
            "units_kept": sorted(chosen),
            "truncated_unit": chosen[-1] if partial else None,
            **({"packing": packing} if packing != self.packing else {}),  # auto cut a turn: the packing it used
            "unit_scores": scores.tolist(),
        }
        return uniform_selection(keep, prefill, state_scores[keep], info)

    def _truncated(self, prompt: RenderedPrompt, unit: Span, room: int) -> list[tuple[int, int]]:
        """Token ranges of ``unit`` that fill ``room`` tokens: best-scoring whole turns of a session first (turn-level
        BM25 over every turn of the prompt; ties: the more recent), then the leading tokens of the next turn; a
        turn (or a session without turn spans) keeps its leading ``room`` tokens."""
        if room <= 0:
            return []
        turns = [t for t in prompt.turns if unit.kind == "session" and unit.start <= t.start and t.end <= unit.end]
        if not turns:
            return [(unit.start, unit.start + room)]
        all_turns = list(prompt.turns)
        texts = [t.text if self.indexed_text == "all" or t.role == "user" else "" for t in all_turns]
        turn_scores = bm25_scores(prompt.question, texts, self.k1, self.b)  # [n_turns]
        score = {(t.start, t.end): float(turn_scores[j]) for j, t in enumerate(all_turns)}
        ranked = sorted(turns, key=lambda t: (-score[(t.start, t.end)], -t.start))
        spans, used = [], 0
        for t in ranked:
            if used + t.length <= room:
                spans.append((t.start, t.end))
                used += t.length
            else:
                spans.append((t.start, t.start + room - used))
                used = room
            if used == room:
                break
        return spans
