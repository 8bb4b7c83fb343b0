"""Experiment specifications: which selectors, budgets and conditions an analysis sweeps, and how.

An analysis module in ``analyses/`` exposes ``SPEC`` (an :class:`ExperimentSpec`) and the names of the figures and
tables it feeds. Defaults are CPU-sized (SmolLM2, the bundled sample); every size knob is a field, so the paper's
scale runs unchanged on a GPU machine (``--model``, ``--data``, ``--limit``, ``--budget``).

Example:
    >>> spec = ExperimentSpec("demo", selectors=("snapkv",), budgets=(0.1,), conditions=("original", "relay"))
    >>> spec.units(["r1", "r2"])
    [('r1', 'snapkv', 0.1), ('r2', 'snapkv', 0.1)]
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field

from relaylens.conditions import get_condition
from relaylens.errors import RelaylensError

ALPHA_CURVE = ("compaction(0)", "compaction(0.25)", "compaction(0.5)", "compaction(0.75)", "compaction(1)")


@dataclass(frozen=True)
class ExperimentSpec:
    """One sweep: records x selectors x budgets x conditions, all conditions sharing one prefill and selection.

    Attributes:
        name: analysis name (module in ``analyses/``).
        selectors: selector names from :data:`relaylens.selectors.REGISTRY`.
        budgets: retention ratios in (0, 1] or absolute state counts (> 1).
        conditions: coordinate conditions run with a real question pass and generation.
        replay_conditions: conditions evaluated by phase replay only (content from the ``original`` pass).
        probes: record evidence-reading probes (needs evidence annotations).
        teacher_forcing: also probe the teacher-forced first answer token.
        max_new_tokens: greedy decoding limit (short answers: room for a restated question).
        prompt_mode: ``"completion"`` or ``"chat"``.
        granularity: gold evidence unit for probes (``"turn"`` or ``"session"``).
        selector_options: per-selector hyperparameter overrides, e.g. ``{"adakv": {"floor_alpha": 0.5}}``.
        limit: default number of records on CPU (``None``: all).
        figures: figure names this analysis feeds (``relaylens figures``).
    """

    name: str
    selectors: tuple[str, ...]
    budgets: tuple[float, ...]
    conditions: tuple[str, ...]
    replay_conditions: tuple[str, ...] = ()
    probes: bool = False
    teacher_forcing: bool = False
    max_new_tokens: int = 32
    prompt_mode: str = "completion"
    granularity: str = "turn"
    selector_options: dict = field(default_factory=dict)
    limit: int | None = None
    figures: tuple[str, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        from relaylens.selectors import REGISTRY

        for name in self.selectors:
            if name not in REGISTRY:
                raise RelaylensError(f"analysis {self.name!r}: unknown selector {name!r}; known: {sorted(REGISTRY)}")
        for condition in self.conditions + self.replay_conditions:
            get_condition(condition)
        if "original" not in self.conditions:
            raise RelaylensError(f"analysis {self.name!r}: conditions must include 'original' (the paired reference)")
        for budget in self.budgets:
            if not (0 < budget <= 1 or (budget > 1 and float(budget).is_integer())):
                raise RelaylensError(f"analysis {self.name!r}: budget {budget} must be a ratio in (0, 1] or a whole number of states")
        # a whole number > 1 arriving as a float (``--budget 64``) is a state count: selectors read floats as ratios
        object.__setattr__(self, "budgets", tuple(int(b) if b > 1 else b for b in self.budgets))
        if self.prompt_mode not in ("chat", "completion"):
            raise RelaylensError(f"prompt_mode must be 'chat' or 'completion'; got {self.prompt_mode!r}")
        if self.max_new_tokens < 0:
            raise RelaylensError(f"max_new_tokens must be >= 0; got {self.max_new_tokens}")

    def units(self, record_ids: list[str]) -> list[tuple[str, str, float]]:
        """Units of work ``(record_id, selector, budget)``; each shares one selection across conditions."""
        return [(rid, sel, budget) for rid in record_ids for sel in self.selectors for budget in self.budgets]

    def replace(self, **changes) -> ExperimentSpec:
        """A copy with fields changed (``None`` values are ignored), validated again."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


ANALYSES_PACKAGE = "relaylens.analyses"
"""The one import path of the analyses: the top-level ``analyses/`` folder, reached as ``relaylens.analyses`` (a
link inside the package; installed as part of relaylens). Nothing imports a top-level ``analyses``, so a foreign
``analyses`` package in the working directory or on ``PYTHONPATH`` can never run."""


def available_analyses() -> list[str]:
    """Names of the analyses shipped with relaylens (``analyses/NAME.py``), sorted."""
    import pkgutil

    package = importlib.import_module(ANALYSES_PACKAGE)
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))


def load_analysis(name: str):
    """Import ``relaylens.analyses.<name>`` and return the module (it has ``SPEC``); only shipped names load.

    Example:
        >>> load_analysis("ordering").SPEC.figures
        ('figure5',)
    """
    known = available_analyses()
    if name not in known:
        raise RelaylensError(f"unknown analysis {name!r}; available: {', '.join(known)}")
    module = importlib.import_module(f"{ANALYSES_PACKAGE}.{name}")
    if not isinstance(getattr(module, "SPEC", None), ExperimentSpec):
        raise RelaylensError(f"analyses/{name}.py defines no SPEC = ExperimentSpec(...)")
    return module
