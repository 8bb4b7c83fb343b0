"""One walk over a run's records: what every runner does to a record before its rows are decoded, written once.

The analysis runner (:mod:`relaylens.experiments.runner`) and the learned-geometry runner
(:mod:`relaylens.experiments.learned_run`) walk their records with :class:`RunWalk`: for each record it renders the
prompt, refuses a history that cannot run (:func:`history_problem`: ``too_long`` / ``too_short``), prefills the
history once (a record whose history tokens equal the previous record's reuses that prefill: :class:`PrefillReuse`),
prepares each selector once, selects each unit once, and commits the units that cannot run as ``skipped`` rows
(:func:`skip_unit`), each skip written once; what it yields (:class:`RecordWork`) is the record's selected units
ready to decode. The run's conditions are parsed once, into objects (:attr:`RunWalk.conditions`), and every
placement check and decoding uses them. Which records a run reads is :func:`relaylens.experiments.config.run_records`
(the runners, the judge's record check and the sweep's shard plan use it); the answer's tokens are
:func:`answer_tokens` (the first answer token is its first element, here and in
:attr:`relaylens.probes.unit.UnitContext.first_answer_token`).

Example:
    >>> from relaylens.experiments.config import RunConfig
    >>> from relaylens.experiments.specs import ExperimentSpec
    >>> from relaylens.testing import tiny_model, tiny_tokenizer
    >>> from relaylens.datasets import bundled_sample_path, load_records
    >>> model, tokenizer = tiny_model("llama", seed=0), tiny_tokenizer()
    >>> spec = ExperimentSpec("w", ("bm25",), (0.4,), ("original", "relay"), prompt_mode="completion")
    >>> walk = RunWalk.start(model, tokenizer, spec, RunConfig())
    >>> work = walk.prepare(load_records(bundled_sample_path())[0], [("bm25", 0.4)])
    >>> [(u.selector, u.budget) for u in work.units], [c.label for c in walk.conditions]
    ([('bm25', 0.4)], ['original', 'relay'])
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from relaylens.conditions.scoped import expand_conditions, unit_position_problem
from relaylens.datasets.prompting import render_prompt
from relaylens.datasets.records import Record
from relaylens.errors import RelaylensError, shown
from relaylens.experiments.config import RunConfig
from relaylens.experiments.specs import ExperimentSpec
from relaylens.experiments.units import UnitWork, prefill_record, query_window, select_units, selector_objects
from relaylens.generation.settings import DecodeSettings, resolve_decoding
from relaylens.geometry.rotary import RotaryFactors
from relaylens.model.tokens import encode_data_text
from relaylens.progress import progress_view
from relaylens.results.atomic import read_text, write_atomic
from relaylens.results.store import UnitKey
from relaylens.results.tables import split_unit_label
from relaylens.results.views import has_view

__all__ = ["PREFILL_REUSE_FILE", "PrefillReuse", "RecordWork", "RunWalk", "advance_bar", "answer_tokens",
           "first_answer_token", "forget_skipped", "history_order", "history_problem", "missing_views", "naming_record",
           "prefill_reuse_enabled", "progress_bar", "skip_unit"]

Tick = Callable[[int, str, str], None]  # (units done, record id, stage): a progress view's advance


@dataclass(frozen=True)
class RecordWork:
    """One record ready to decode: its prompt, its history's prefill (shared read-only by every unit and condition),
    the seconds that prefill and the selectors' preparation took this record, and the selected units every condition
    can place (in the order asked for)."""

    record: Record
    prompt: Any  # relaylens.datasets.spans.RenderedPrompt
    prefill: Any  # relaylens.model.prefill.PrefillResult
    prefill_s: float
    units: list[UnitWork]


@dataclass
class RunWalk:
    """The walk of one run: its model, spec and config, its selectors (built once), its conditions (parsed once) and
    the prefill it may reuse. :meth:`prepare` turns one record and the units it still owes into a :class:`RecordWork`
    (or None when the record cannot run), committing every unit that cannot run as skipped, once.

    ``store`` takes the skips (None: nothing is committed, e.g. a dry walk); ``tick`` is told of every unit settled
    here (a progress view's advance)."""

    model: Any
    tokenizer: Any
    spec: ExperimentSpec
    config: RunConfig
    factors: RotaryFactors
    selectors: dict
    conditions: list
    reuse: PrefillReuse
    store: Any = None
    tick: Tick | None = None

    @classmethod
    def start(cls, model, tokenizer, spec: ExperimentSpec, config: RunConfig, store=None, factors=None,
              reuse: PrefillReuse | None = None, tick: Tick | None = None) -> RunWalk:
        """A walk over ``spec``'s selectors (``config.seed``) and conditions (scoped conditions learn the model's
        layer types here, once); ``reuse`` defaults to :func:`prefill_reuse_enabled`."""
        factors = factors if factors is not None else RotaryFactors.from_model(model)
        reuse = reuse if reuse is not None else PrefillReuse(prefill_reuse_enabled())
        if config.decoding == "auto":  # a walk started without open_run, which resolves it before the manifest
            devices = {str(p.device) for p in model.parameters()}
            config = replace(config, decoding=resolve_decoding(config.decoding, min(devices),
                                                               compile_backend=config.compile_backend,
                                                               device_map="spread" if len(devices) > 1 else None))
        return cls(model, tokenizer, spec, config, factors, selector_objects(spec, config.seed),
                   expand_conditions(spec.conditions, model), reuse, store, tick)

    @property
    def decode_settings(self) -> DecodeSettings:
        """What every row of this run decodes under (limit, stops, window mode, factors, decoding path), one object
        for every batch of the run (:class:`relaylens.generation.settings.DecodeSettings`)."""
        spec, config = self.spec, self.config
        return DecodeSettings(max_new_tokens=spec.max_new_tokens, tokenizer=self.tokenizer,
                              stop_at_newline=spec.stops_at_newline(spec.prompt_mode), window_mode=config.window_mode,
                              factors=self.factors, eos_token_ids=frozenset() if spec.stop == "none" else None,
                              decoding=config.decoding, compile_backend=config.compile_backend)

    def with_spec(self, spec: ExperimentSpec) -> RunWalk:
        """This walk under another spec of the same run (e.g. with a learned condition added): its conditions parsed
        once more; model, selectors, prefill reuse, store and progress stay."""
        return replace(self, spec=spec, conditions=expand_conditions(spec.conditions, self.model))

    def prepare(self, record: Record, units: list[tuple[str, float]], committed=(),
                placed: bool = True) -> RecordWork | None:
        """Render, check, prefill, prepare and select ``record`` for ``units`` (``(selector label, budget)``).

        A unit that cannot run is committed as skipped unless it is in ``committed`` (already in the store: asked for
        again for another reason, e.g. its token view): the whole record when its history cannot run (None is
        returned), a unit whose budget fits no unit of the selector (``too_short``), and, with ``placed``, a unit
        some condition of :attr:`conditions` cannot place (``too_long`` / ``position``). Errors of the record name
        it."""
        spec, rid, committed = self.spec, record.record_id, set(committed)
        owed = [u for u in units if u not in committed]
        with naming_record(rid):
            prompt = render_prompt(record, self.tokenizer, mode=spec.prompt_mode)
            reason = history_problem(prompt, spec, self.config, self.factors)
            if reason is not None:
                for name, budget in owed:
                    self._skip(rid, name, budget, prompt.history_length, *reason)
                if owed:
                    self._tick(len(owed), rid, f"skipped ({reason[0]})")
                return None
            started = time.perf_counter()
            prefill = self.reuse.prefill(self.model, prompt, self.config, self.selectors.values())
            bases = dict.fromkeys(split_unit_label(name)[0] for name, _ in units)
            prepared = {name: self.selectors[name].prepare(self.model, prefill, prompt, self.factors)  # FINCH
                        for name in bases}
            prefill_s = time.perf_counter() - started
            self._tick(0, rid, f"selecting {len(owed)} units")
            selected, too_short = select_units(prefill, prompt, list(units), prepared, spec.protect_instructions)
            for name, budget, err in too_short:
                if (name, budget) in committed:
                    continue
                self._skip(rid, name, budget, prompt.history_length, "too_short",
                           f"record {rid}: {name} @ {budget:g}: {err}")
                self._tick(1, rid, "skipped (too_short)")
            if placed:
                selected = self.placeable(record, prompt, selected, committed)
            return RecordWork(record, prompt, prefill, prefill_s, selected)

    def placeable(self, record: Record, prompt, units: list[UnitWork], committed=()) -> list[UnitWork]:
        """The units every one of :attr:`conditions` can place; the others are committed as skipped (``too_long``: a
        question start past the rotary range, e.g. a large ``geometry`` b; ``position``: a ``move=`` past the
        question) unless in ``committed``, as :func:`history_problem` skips a ``query_only`` shift past the range
        (issue 41, item 13)."""
        tail = int(prompt.question_ids.numel()) + max(self.spec.max_new_tokens, 1) + 1
        rid, kept, committed = record.record_id, [], set(committed)
        for unit in units:
            problem = unit_position_problem(self.conditions, unit.selection, tail, self.factors.position_limit)
            if problem is None:
                kept.append(unit)
                continue
            if (unit.selector, unit.budget) in committed:  # committed earlier: left as it is
                continue
            self._skip(rid, unit.selector, unit.budget, prompt.history_length, problem[0],
                       f"record {rid}: {unit.selector} @ {unit.budget:g}: {problem[1]}")
            self._tick(1, rid, f"skipped ({problem[0]})")
        return kept

    def _skip(self, record_id: str, selector: str, budget: float, history_length: int, reason: str,
              detail: str) -> None:
        if self.store is not None:
            skip_unit(self.store, record_id, selector, budget, history_length, reason, detail)

    def _tick(self, steps: int, record_id: str, stage: str) -> None:
        if self.tick is not None:
            self.tick(steps, record_id, stage)


def first_answer_token(tokenizer, record: Record, mode: str) -> int | None:
    """The first token of the first reference answer as it would follow the answer cue."""
    ids = answer_tokens(tokenizer, record, mode)
    return ids[0] if ids else None


def answer_tokens(tokenizer, record: Record, mode: str) -> list[int]:
    """The tokens of the first reference answer as they would follow the answer cue (empty for abstentions)."""
    if not record.answers or record.is_abstention:
        return []
    prefix = " " if mode == "completion" else ""
    ids, _ = encode_data_text(tokenizer, prefix + record.answers[0])  # special-token strings in data stay text
    return [int(i) for i in ids]


def history_order(records) -> list[int]:
    """The indices of ``records`` in the order a walk computes them: records over one history (equal sessions, e.g.
    the questions of one LoCoMo conversation) follow each other, groups in the order their first record appears, file
    order inside a group, so :class:`PrefillReuse` prefills a shared history once even where the run's record order
    (``--record-order interleave``) separates its questions. Only the order units are computed in changes: tables
    are keyed by unit.

    Two records share a history when their sessions hold the same ids, dates, roles and texts (the evidence flags,
    which differ per question and are never rendered, do not count); :class:`PrefillReuse` still checks the rendered
    tokens before it reuses anything.

    >>> from relaylens.datasets.records import Session, Turn
    >>> def record(text, gold=False):
    ...     session = Session("s1", None, (Turn("user", text, has_answer=gold),), is_evidence=gold)
    ...     return Record("q", "?", ("x",), "t", None, (session,), (), False)
    >>> history_order([record("a"), record("b"), record("a", gold=True), record("c"), record("b")])
    [0, 2, 1, 4, 3]
    """
    first: dict = {}
    keys = [tuple((s.session_id, s.date, tuple((t.role, t.content) for t in s.turns)) for s in r.sessions)
            for r in records]
    for index, key in enumerate(keys):
        first.setdefault(key, index)
    return sorted(range(len(records)), key=lambda i: (first[keys[i]], i))


@contextmanager
def naming_record(record_id: str):
    """Re-raise a relaylens error of one record with the record's id in front (unless the message names it)."""
    try:
        yield
    except RelaylensError as err:
        if record_id in str(err):
            raise
        raise type(err)(f"record {record_id}: {err}") from err


def history_problem(prompt, spec: ExperimentSpec, config: RunConfig, factors) -> tuple[str, str] | None:
    """``(reason, detail)`` when a record cannot run at all, else None.

    * ``too_long``: the history exceeds ``config.max_history_tokens``, or the positions the run needs (history, the
      largest condition shift, question, teacher token and ``max_new_tokens``) pass the model's rotary range.
    * ``too_short``: the history is not longer than the observation window the prefill captures.
    """
    L, rid = prompt.history_length, prompt.record_id
    if config.max_history_tokens is not None and L > config.max_history_tokens:
        return "too_long", (f"record {rid}: history of {L} tokens exceeds --max-history-tokens "
                            f"{config.max_history_tokens}")
    needed = L + spec.max_shift + int(prompt.question_ids.numel()) + max(spec.max_new_tokens, 1) + 1
    if needed > factors.position_limit:
        limit = (f"max_position_embeddings={factors.max_position}" if factors.position_limit == factors.max_position
                 else "of 2**24 positions (float32 phases cannot tell larger positions apart)")
        return "too_long", (f"record {rid}: history of {L} tokens needs positions up to {needed - 1} (largest "
                            f"condition shift {spec.max_shift}, question and {spec.max_new_tokens} new tokens), "
                            f"past the model's rotary range {limit}")
    if L <= config.window_size:
        return "too_short", (f"record {rid}: history of {L} tokens is not longer than the {config.window_size}-token "
                             "observation window")
    return None


def skip_unit(store, record_id: str, selector: str, budget: float, history_length: int, reason: str,
              detail: str) -> None:
    row = {"record_id": record_id, "selector": selector, "budget": float(budget), "reason": reason,
           "history_length": int(history_length), "detail": detail}
    store.write_unit(UnitKey(record_id, selector, budget), [], [], [], skipped_rows=[row])


def forget_skipped(store, keys) -> None:
    """Delete committed units that only record a skip, so they run again (``--retry-skipped``)."""
    for key in keys:
        path = store.unit_path(key)
        if path.exists() and len(store.read_unit(path)["skipped"]):
            store.remove_unit(key)


def missing_views(store, keys) -> list[tuple[str, float]]:
    """``(selector, budget)`` of the committed units whose probes ran (a token view was due) but whose view is
    missing or damaged (a write that failed after the commit): the resumed run computes them again for the view
    only."""
    missing = []
    for key in keys:
        if store.is_done(key) and not has_view(store.run_dir, key):
            probes = store.load_unit(store.unit_path(key))["probes"]
            if "forward" in probes["source"]:
                missing.append((key.selector, key.budget))
    return missing


def progress_bar(enabled: bool):
    if not enabled or _jupyter_without_widgets():
        return nullcontext(None)  # in Jupyter without ipywidgets rich would warn once per refresh: no bar instead
    return progress_view()


def _jupyter_without_widgets() -> bool:
    """True inside a Jupyter kernel where ipywidgets cannot be imported (rich's live display needs it there)."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        import ipywidgets  # noqa: F401, PLC0415 - lazy on purpose: an optional package, probed only inside Jupyter
    except ImportError:
        return True
    return False


def advance_bar(live, task, steps: int, record_id: str, stage: str) -> None:
    if live is not None:  # a record id is dataset text: shown, never interpreted by the terminal
        live.update(task, advance=steps, stage=f"{shown(record_id)}: {stage}")


PREFILL_REUSE_FILE = "prefill_reuse.json"
"""The run directory's record of history prefills reused (summed over the invocations that reused one)."""


def prefill_reuse_enabled() -> bool:
    """Whether a run reuses a history's prefill for the next record with the same history tokens: yes, unless
    ``RELAYLENS_NO_PREFILL_REUSE`` is set to anything but ``0`` (then every record prefills its own history)."""
    return os.environ.get("RELAYLENS_NO_PREFILL_REUSE", "0") in ("", "0")


class PrefillReuse:
    """The last history prefill of a run, reused by the next record whose rendered history tokens are identical
    (questions over one conversation, e.g. LoCoMo's; the records of a conversation are consecutive in the file).

    The prefill depends on the history tokens only (its window queries are the history's last tokens; the window
    and column sums follow from the run's selectors and the history length, both part of the key); what depends on
    the question (FINCH's ``prepare``, the selection, every condition's question pass) still runs per record. The
    reused :class:`~relaylens.model.prefill.PrefillResult` is shared read-only, as every unit and condition of one
    record already shares it: relocation and selection build new tensors and never write into it (a test checks
    this). ``prefills`` / ``reused`` count the prefills computed and reused; ``saved_s`` sums the prefill seconds
    each reuse did not spend (the reused prefill's own time). A record that reuses a prefill reports in its
    ``prefill_s`` column only the time it spent itself (FINCH's question pass, when the run has FINCH). Only the last
    history is kept, so a resumed run or a shard prefills the first history it meets again.

    Example:
        >>> reuse = PrefillReuse(enabled=False)
        >>> reuse.prefills, reuse.reused, reuse.saved_s
        (0, 0, 0.0)
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.prefills, self.reused, self.saved_s = 0, 0, 0.0
        self._last = None  # (history_ids [L], (window, column sums), PrefillResult, its prefill seconds)

    def prefill(self, model, prompt, config: RunConfig, selectors):
        """The prefill of ``prompt``'s history: the last one when its history tokens and capture settings match, else
        :func:`~relaylens.experiments.units.prefill_record`."""
        selectors = list(selectors)
        key = (query_window(config, selectors, prompt.history_length),
               any(getattr(s, "needs_column_sums", False) for s in selectors))
        last = self._last
        if last is not None and last[1] == key and torch.equal(last[0], prompt.history_ids):
            self.reused += 1
            self.saved_s += last[3]
            return last[2]
        self._last = None  # the previous history's states are released before the next prefill
        started = time.perf_counter()
        prefill = prefill_record(model, prompt, config, selectors)
        self.prefills += 1
        if self.enabled:
            self._last = (prompt.history_ids.clone(), key, prefill, time.perf_counter() - started)
        return prefill

    def finish(self, run_dir: Path, say: bool = True) -> dict | None:
        """Add this invocation's counts to ``RUN_DIR/prefill_reuse.json`` (written once a prefill was reused) and
        print them when ``say``; returns the run's totals, or None when nothing was reused."""
        path = Path(run_dir) / PREFILL_REUSE_FILE
        if not self.reused and not path.exists():
            return None
        try:
            totals = json.loads(read_text(path) or "{}")  # no link followed (relaylens.fileio)
        except ValueError:
            totals = {}  # a damaged note is started afresh: it carries timing only, never results
        totals = {"prefills": int(totals.get("prefills", 0)) + self.prefills,
                  "reused": int(totals.get("reused", 0)) + self.reused,
                  "saved_s": round(float(totals.get("saved_s", 0.0)) + self.saved_s, 3)}
        write_atomic(path, json.dumps(totals, indent=2, sort_keys=True) + "\n")  # whole, no link followed
        if say and self.reused:
            print(f"history prefill reused for {self.reused} record(s) sharing a history ({self.prefills} computed); "
                  f"{self.saved_s:.1f} s of prefill saved (run total {totals['saved_s']:.1f} s, {PREFILL_REUSE_FILE})",
                  file=sys.stderr)
        return totals
