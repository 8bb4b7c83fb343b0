"""Experiment specifications: which selectors, budgets and conditions an analysis sweeps, and how.

An analysis module in ``relaylens/analyses/`` declares ``SPEC`` (an :class:`ExperimentSpec`, naming the figures and
tables it feeds) in its record ``ANALYSIS`` (:class:`~relaylens.experiments.analysis.Analysis`). Defaults are
CPU-sized (SmolLM2, the bundled sample); every size knob is a field, so the paper's scale runs unchanged on a GPU
machine (``--model``, ``--data``, ``--limit``, ``--budget``).

Example:
    >>> spec = ExperimentSpec("demo", selectors=("snapkv",), budgets=(0.1,), conditions=("original", "relay"))
    >>> spec.units(["r1", "r2"])
    [('r1', 'snapkv', 0.1), ('r2', 'snapkv', 0.1)]
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass, field

from relaylens import moved_name
from relaylens.conditions.scoped import get_condition
from relaylens.datasets.prompting import STOP_ON_NEWLINE
from relaylens.errors import RelaylensError
from relaylens.experiments.analysis import Analysis
from relaylens.registry import Registry
from relaylens.results.tables import unit_labels

PROMPT_MODES = ("chat", "completion", "auto")
"""How a record becomes a prompt (``ExperimentSpec.prompt_mode``, ``--prompt-mode``): the chat template, plain
completion text, or ``auto`` (chat where the tokenizer has a template)."""
STOPS = ("auto", "eos", "newline", "none")
"""When greedy decoding stops (``ExperimentSpec.stop``, ``--stop``); ``auto`` stops at a newline in completion mode and
at EOS in chat mode."""
ALPHA_CURVE = ("compaction(0)", "compaction(0.25)", "compaction(0.5)", "compaction(0.75)", "compaction(1)")
"""The ``compaction(alpha)`` conditions of the phase-replay curve, from ``original`` (0) to ``relay`` (1)."""


@dataclass(frozen=True)
class ExperimentSpec:
    """One sweep: records x selectors x budgets x conditions, all conditions sharing one prefill and selection.

    Attributes:
        name: analysis name (module in ``relaylens/analyses/``).
        selectors: selector names from :data:`relaylens.selectors.REGISTRY`, or ``kvpress:<PressName>``.
        budgets: retention ratios in (0, 1] or absolute state counts (> 1).
        conditions: coordinate conditions run with a real question pass and generation.
        replay_conditions: conditions evaluated by phase replay only (content from the ``original`` pass).
        probes: record evidence-reading probes (needs evidence annotations).
        teacher_forcing: also probe the teacher-forced first answer token.
        attribution: also attribute the answer to the evidence (gradient x input, direct logit attribution; needs
            ``probes`` and ``teacher_forcing``): the question pass runs with autograd, see
            :mod:`relaylens.probes.attribution`.
        max_new_tokens: greedy decoding limit; 512 by default, the paper's (memory QA decodes until EOS, and the
            ``answering`` table reports how often the limit cut an answer).
        prompt_mode: ``"completion"``, ``"chat"`` or ``"auto"`` (the default: chat where the tokenizer has a chat
            template; the runner records the mode it chose).
        stop: when decoding stops besides ``max_new_tokens``: ``"eos"`` (the model's end token), ``"newline"``
            (also at the first newline), ``"none"`` (fixed length, for timing) or ``"auto"`` (newline in completion
            mode, EOS in chat mode).
        granularity: gold evidence unit for probes (``"turn"`` or ``"session"``).
        selector_options: per-selector hyperparameter overrides, e.g. ``{"adakv": {"floor_alpha": 0.5}}``.
        limit: default number of records on CPU (``None`` or 0: all).
        figures: figure names this analysis feeds (``relaylens figures``).
        data: the bundled sample the analysis runs on when ``--data`` is ``sample``: ``"sample"`` (LongMemEval
            schema), ``"sample:infinitebench"`` (InfiniteBench format) or ``"sample:hellobench"`` (HelloBench
            summarization format).
        protect_instructions: keep every history token outside the source units (task instruction, chat-template
            head, separators) and apply the budget to the source tokens only (:mod:`relaylens.selectors.protection`; the
            paper's rule: the retention ratio is of the input history tokens; instructions and templates are kept
            and counted separately). On by default (the paper's regime); ``False`` (``--no-protect-instructions``) is
            the *framing evicted* ablation, named so in the manifest (``regime.framing``).
        framing_cells: the ``framing`` analysis's factor: each selector runs once per cell of
            :data:`relaylens.selectors.protection.FRAMING_CELLS` (what is kept on top of the same source budget),
            labelled ``SELECTOR@keep=CELL`` in the tables; empty (the default) runs each selector once.
        sensitivity: also record the positional sensitivity readout (:mod:`relaylens.probes.sensitivity`: the
            gradient of the first answer token's log-probability w.r.t. each (layer, kv head)'s distance ``b`` and gap
            scale ``s``; one backward pass per record and condition) in the probes table.
        sweep: ``"layers"`` adds the per-layer causal sweep (:mod:`relaylens.probes.layer_sweep`: relay in each layer
            alone and in layers ``0..l``, one question pass each, about ``2 x layers`` passes per record); ``""``
            (the default) runs none.
        preset: the named preset applied (``"paper"``; :func:`relaylens.experiments.presets.apply_preset` sets it),
            recorded in the manifest beside its effect; ``""`` for the analysis's own ``SPEC``.
        probe_kinds: probe kinds switched on by name (``--probe NAME``, repeatable): each a kind of
            :data:`relaylens.probes.PROBE_KINDS` (a plugin's too) whose ``enabled(spec, config)`` reads
            ``NAME in spec.probe_kinds``, so a kind with its own switch needs no field here. The built-in kinds'
            names set their switches instead (``replay`` and ``token_view``: ``probes``; ``sensitivity``;
            ``layer_sweep``: ``sweep="layers"``), so one run has one spelling in its manifest; empty (the default)
            is left out of the manifest.
    """

    name: str
    selectors: tuple[str, ...]
    budgets: tuple[float, ...]
    conditions: tuple[str, ...]
    replay_conditions: tuple[str, ...] = ()
    probes: bool = False
    teacher_forcing: bool = False
    attribution: bool = False
    max_new_tokens: int = 512
    prompt_mode: str = "auto"
    stop: str = "auto"
    granularity: str = "turn"
    selector_options: dict = field(default_factory=dict)
    limit: int | None = None
    figures: tuple[str, ...] = ()
    description: str = ""
    data: str = "sample"
    sweep: str = ""
    protect_instructions: bool = True
    sensitivity: bool = False
    preset: str = ""
    framing_cells: tuple[str, ...] = ()
    probe_kinds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.probe_kinds:
            self._switch_probe_kinds()
        from relaylens.selectors import REGISTRY, is_selector_name  # noqa: PLC0415 - import cost: torch loads on first use

        for name in self.selectors:
            if not is_selector_name(name):
                raise RelaylensError(f"analysis {self.name!r}: unknown selector {name!r}; known: {sorted(REGISTRY)} or "
                                     "kvpress:<PressName>")
        from relaylens.model.hf import POSITION_LIMIT  # noqa: PLC0415 - import cost: torch loads on first use

        for condition in self.conditions + self.replay_conditions:
            shift = int(getattr(get_condition(condition), "shift", 0))
            if shift >= POSITION_LIMIT:  # every record would need positions float32 phases cannot tell apart
                raise RelaylensError(f"analysis {self.name!r}: condition {condition!r} shifts the question by "
                                     f"{shift:,} positions, at or past 2**24 = {POSITION_LIMIT:,}, where the rotary "
                                     "embedding's float32 positions collapse (distinct positions share one phase). "
                                     "Fix: a shift below the model's context (e.g. query_only(2048))")
        if "original" not in self.conditions:
            raise RelaylensError(f"analysis {self.name!r}: conditions must include 'original' (the paired reference)")
        for budget in self.budgets:
            if not (0 < budget <= 1 or (budget > 1 and float(budget).is_integer())):
                raise RelaylensError(f"analysis {self.name!r}: budget {budget} must be a ratio in (0, 1] or a whole "
                                     "number of states")
        # a whole number > 1 arriving as a float (``--budget 64``) is a state count: selectors read floats as ratios
        object.__setattr__(self, "budgets", tuple(int(b) if b > 1 else b for b in self.budgets))
        if self.prompt_mode not in PROMPT_MODES:
            raise RelaylensError(f"prompt_mode must be one of {PROMPT_MODES}; got {self.prompt_mode!r}")
        if self.stop not in STOPS:
            raise RelaylensError(f"stop must be one of {STOPS}; got {self.stop!r}")
        if self.granularity not in ("turn", "session"):
            raise RelaylensError(f"granularity must be 'turn' or 'session'; got {self.granularity!r}")
        from relaylens.selectors import make_selector  # noqa: PLC0415 - import cost: torch loads on first use

        for name, options in self.selector_options.items():
            if name not in self.selectors:
                raise RelaylensError(f"analysis {self.name!r}: options given for selector {name!r}, which is not swept "
                                     f"(selectors: {list(self.selectors)})")
            make_selector(name, **options)  # unknown hyperparameters: one clear line naming the selector
        if self.attribution and not (self.probes and self.teacher_forcing):
            raise RelaylensError(f"analysis {self.name!r}: attribution=True needs probes=True and teacher_forcing=True")
        if self.max_new_tokens < 0:
            raise RelaylensError(f"max_new_tokens must be >= 0; got {self.max_new_tokens}")
        if self.sweep not in ("", "layers"):
            raise RelaylensError(f"sweep must be 'layers' or empty (none); got {self.sweep!r}")
        from relaylens.selectors.protection import FRAMING_CELLS  # noqa: PLC0415 - import cost: torch loads on first use

        unknown = [c for c in self.framing_cells if c not in FRAMING_CELLS]
        if unknown or len(set(self.framing_cells)) != len(self.framing_cells):
            raise RelaylensError(f"analysis {self.name!r}: framing cells must be distinct names of {FRAMING_CELLS}; "
                                 f"got {list(self.framing_cells)}. Fix: name each cell once")

    def _switch_probe_kinds(self) -> None:
        """Check :attr:`probe_kinds` against the registry and turn the built-in kinds' names into their switches."""
        from relaylens.probes.registry import PROBE_KINDS  # noqa: PLC0415 - import cost: torch loads on first use

        names = tuple(self.probe_kinds)
        unknown = [n for n in names if n not in PROBE_KINDS]
        if unknown or len(set(names)) != len(names):
            raise RelaylensError(f"analysis {self.name!r}: --probe takes each kind once, one of {list(PROBE_KINDS)}; "
                                 f"got {list(names)}. Fix: name registered probe kinds (a plugin's kind is listed once "
                                 "its distribution is installed)")
        switches = {"replay": ("probes", True), "token_view": ("probes", True), "sensitivity": ("sensitivity", True),
                    "layer_sweep": ("sweep", "layers")}
        for name in names:
            if name in switches:
                object.__setattr__(self, *switches[name])
        object.__setattr__(self, "probe_kinds", tuple(n for n in names if n not in switches))

    def stops_at_newline(self, prompt_mode: str) -> bool:
        """Whether decoding stops at the first newline under ``prompt_mode`` (the resolved one): ``newline`` always,
        ``auto`` where the prompt mode does (:data:`relaylens.datasets.prompting.STOP_ON_NEWLINE`)."""
        return self.stop == "newline" or (self.stop == "auto" and STOP_ON_NEWLINE.get(prompt_mode, False))

    @property
    def max_shift(self) -> int:
        """The largest position shift a condition adds past the history (``query_only``/``common_shift``)."""
        return max((int(getattr(get_condition(c), "shift", 0)) for c in self.conditions), default=0)

    def units(self, record_ids: list[str]) -> list[tuple[str, str, float]]:
        """Units of work ``(record_id, selector, budget)``; each shares one selection across conditions (the
        selector is a :meth:`unit_selectors` label)."""
        return [(rid, sel, budget) for rid in record_ids for sel in self.unit_selectors() for budget in self.budgets]

    def unit_selectors(self) -> list[str]:
        """The ``selector`` labels of the units: the selector names, or ``NAME@keep=CELL`` per framing cell.

        >>> ExperimentSpec("f", ("bm25",), (0.1,), ("original",), framing_cells=("none", "sink4")).unit_selectors()
        ['bm25@keep=none', 'bm25@keep=sink4']
        """
        return unit_labels(self.selectors, self.framing_cells)

    @property
    def regime(self) -> dict:
        """How this spec departs from the paper's regime, in words (recorded in the manifest):
        ``framing`` (``protected``: instruction and template kept outside the budget; ``evicted (ablation)``:
        inside it; ``per cell``: the ``framing`` analysis), ``answers`` (the decoding limit and stop rule) and, for a
        run whose BM25 granularity is ``auto`` (its default), ``bm25_units`` (the rule that picks sessions or turns)."""
        framing = ("per cell (framing analysis)" if self.framing_cells else
                   "protected (kept outside the budget)" if self.protect_instructions else
                   "evicted (ablation: framing inside the budget)")
        out = {"framing": framing, "answers": f"up to {self.max_new_tokens} new tokens, stop {self.stop}"}
        if "bm25" in self.selectors and self.selector_options.get("bm25", {}).get("granularity", "auto") == "auto":
            from relaylens.selectors.bm25 import AUTO_RULE  # noqa: PLC0415 - import cost: the selectors import torch

            out["bm25_units"] = AUTO_RULE  # the unit BM25 ranks: sessions, or turns where no session fits (per record)
        return out

    def replace(self, **changes) -> ExperimentSpec:
        """A copy with fields changed (``None`` values are ignored), validated again."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if not out["sweep"]:  # manifests of runs without a sweep stay as they were before the field existed
            del out["sweep"]
        if not out["protect_instructions"]:  # likewise for runs without protected spans
            del out["protect_instructions"]
        if not out["sensitivity"]:  # and without the positional sensitivity readout
            del out["sensitivity"]
        if not out["preset"]:  # and for runs without a preset
            del out["preset"]
        if not out["framing_cells"]:  # and outside the framing analysis
            del out["framing_cells"]
        if not out["probe_kinds"]:  # and for runs that switch no probe kind by name
            del out["probe_kinds"]
        out["regime"] = self.regime
        return out


ANALYSES_PACKAGE = "relaylens.analyses"
"""The one import path of the analyses: the package folder ``relaylens/analyses/`` (installed as part of relaylens).
Nothing imports a top-level ``analyses``, so a foreign
``analyses`` package in the working directory or on ``PYTHONPATH`` can never run."""


def check_analysis(name: str, record) -> None:
    """Refuse what cannot be the analysis ``name``: no :class:`~relaylens.experiments.analysis.Analysis` record with an
    :class:`ExperimentSpec`, or one named otherwise (the check of :data:`ANALYSES`)."""
    if not isinstance(record, Analysis) or not isinstance(record.spec, ExperimentSpec):
        raise RelaylensError(f"relaylens/analyses/{name}.py defines no ANALYSIS = Analysis(SPEC, PRESETS, "
                             "doc=__doc__) with SPEC = ExperimentSpec(...). Fix: end the module with that line "
                             "(relaylens.experiments.analysis.Analysis)")
    if record.name != name:
        raise RelaylensError(f"relaylens/analyses/{name}.py declares an analysis named {record.name!r}. Fix: name its "
                             f"ExperimentSpec {name!r}, like its file")


ANALYSES: Registry[Analysis] = Registry("analysis", check=check_analysis)
"""Every shipped analysis by name (a :class:`~relaylens.registry.Registry`, the idiom of every registry of relaylens):
one lazy ``relaylens.analyses.NAME:ANALYSIS`` entry per module of the folder, listed (never imported) on first use;
an analysis module is imported when its record is asked for. No entry-point group: an analysis is a file of this
package (what a plugin adds is a selector, condition, probe kind, format, figure or benchmark)."""


def _list_analyses() -> None:
    """Fill :data:`ANALYSES` from the folder, once per process (an empty registry: not listed yet)."""
    if len(ANALYSES):
        return
    package = importlib.import_module(ANALYSES_PACKAGE)
    for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")):
        ANALYSES.register(module, f"{ANALYSES_PACKAGE}.{module}:ANALYSIS")


def available_analyses() -> list[str]:
    """Names of the analyses shipped with relaylens (``relaylens/analyses/NAME.py``), sorted."""
    _list_analyses()
    return sorted(ANALYSES)


def load_analysis(name: str) -> Analysis:
    """Import ``relaylens.analyses.<name>`` and return its :class:`~relaylens.experiments.analysis.Analysis` record
    (``ANALYSIS``: spec, presets, its own runner and flags if any; through :data:`ANALYSES`); only shipped names load
    (a name that is not a Python identifier, e.g. ``.``, ``..`` or ``../x``, never reaches the import system).

    Example:
        >>> load_analysis("ordering").spec.figures
        ('figure5',)
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise RelaylensError(f"analysis name {name!r} is not a plain name (letters, digits, underscores); available: "
                             f"{', '.join(available_analyses())}")
    known = available_analyses()
    if name not in known:
        raise RelaylensError(f"unknown analysis {name!r}; available: {', '.join(known)}")
    try:
        return ANALYSES[name]
    except AttributeError as err:  # the module has no ANALYSIS: the check's message, not a traceback
        if getattr(err, "name", None) != "ANALYSIS":
            raise
        check_analysis(name, None)
        raise


def parse_selector_arg(text: str) -> tuple[str, dict]:
    """``NAME[:key=value,...]`` -> ``(name, options)`` (values read as bool, int, float or text; each selector
    checks types and ranges when the spec is built, before any model loads). A kvpress press is
    ``kvpress:<PressName>[:key=value,...]``; its name keeps the press's spelling.

    >>> parse_selector_arg("bm25:packing=truncate,k1=1.2")
    ('bm25', {'packing': 'truncate', 'k1': 1.2})
    >>> parse_selector_arg("kvpress:snapkvpress:window_size=64")
    ('kvpress:SnapKVPress', {'window_size': 64})
    """
    from relaylens.selectors.arguments import parse_selector_arg as parse  # noqa: PLC0415 - import cost: torch loads on first use

    return parse(text)  # one parser for every caller (relaylens.selectors.arguments)


def apply_overrides(spec: ExperimentSpec, selectors: list[str] | None = None, conditions: list[str] | None = None,
                    **fields) -> ExperimentSpec:
    """``spec`` with CLI overrides: ``--selector`` entries (with hyperparameters), ``--condition`` entries
    (``original`` is added first when missing), and any field given (None: unchanged).

    >>> spec = ExperimentSpec("demo", selectors=("snapkv",), budgets=(0.1,), conditions=("original", "relay"))
    >>> s = apply_overrides(spec, selectors=["bm25:packing=truncate"], conditions=["key_only"], stop="eos")
    >>> s.selectors, s.selector_options, s.conditions, s.stop
    (('bm25',), {'bm25': {'packing': 'truncate'}}, ('original', 'key_only'), 'eos')
    """
    changes = dict(fields)
    if selectors:
        names, options = [], {}
        for text in selectors:
            name, opts = parse_selector_arg(text)
            if name in names:
                raise RelaylensError(f"--selector {name!r} given twice; give each selector once with all its options")
            names.append(name)
            if opts:
                options[name] = opts
        changes["selectors"] = tuple(names)
        changes["selector_options"] = options
    if conditions:
        labels = [get_condition(c).label for c in conditions]
        changes["conditions"] = tuple(dict.fromkeys((["original"] if "original" not in labels else []) + labels))
    return spec.replace(**changes)


def __getattr__(name: str):  # old names of this module (relaylens.MOVED_NAMES), until relaylens.REMOVED_IN
    return moved_name(__name__, name)
