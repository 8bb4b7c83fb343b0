"""The analysis record: what ``relaylens/analyses/NAME.py`` declares, in one typed, frozen value.

Every analysis module ends with ``ANALYSIS = Analysis(SPEC, PRESETS, doc=__doc__)`` (plus, where it has them, its own
runner, its options and their command-line flags, or a default for ``--batch-rows``);
:func:`relaylens.experiments.specs.load_analysis` returns that record. Nothing reads loose module attributes: a new
option of one analysis is one :class:`CliOption` line in that analysis's module (the command line declares it on
``relaylens run``, in the analysis's own help panel, and refuses it for every other analysis).

Importing this module imports no other relaylens module than :mod:`relaylens.errors` (specs and presets import it).

Example:
    >>> from relaylens.experiments.specs import load_analysis
    >>> ordering = load_analysis("ordering")
    >>> ordering.name, ordering.spec.figures, sorted(ordering.presets), ordering.run is None
    ('ordering', ('figure5',), ['paper'], True)
    >>> [flag.flag for flag in load_analysis("learned_geometry").cli_options][:2]
    ['--steps', '--learning-rate']
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from relaylens import REMOVED_IN, moved_name
from relaylens.errors import RelaylensError

FLAG_TYPES = (int, float, str)


@dataclass(frozen=True)
class CliOption:
    """One command-line flag of ``relaylens run NAME`` that only analysis ``NAME`` takes.

    Attributes:
        name: the keyword (``learning_rate``); the flag is ``--`` plus the name with dashes (``--learning-rate``).
        type: ``int``, ``float`` or ``str``.
        help: the flag's help line (with its default, which lives in :attr:`Analysis.options`).
        field: the field of :attr:`Analysis.options` the flag sets (default: ``name``).
    """

    name: str
    type: type
    help: str
    field: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name.startswith("_"):
            raise RelaylensError(f"CliOption name {self.name!r} is not a keyword (letters, digits, underscores). Fix: "
                                 "name it like a Python parameter, e.g. learning_rate")
        if self.type not in FLAG_TYPES:
            raise RelaylensError(f"CliOption {self.name!r}: type {self.type!r} is not one of int, float, str")
        if not self.field:
            object.__setattr__(self, "field", self.name)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Analysis:
    """One analysis: its spec, its named presets and, for analyses that do not run through the sweep runner, its own
    runner, its options and their flags.

    Attributes:
        spec: the CPU-sized :class:`~relaylens.experiments.specs.ExperimentSpec` (``relaylens run NAME``).
        presets: named :class:`~relaylens.experiments.presets.Preset` changes (``--preset paper``).
        run: the analysis's own runner, ``run(spec, config, options) -> run directory``; ``None``: the sweep runner
            (:func:`relaylens.experiments.runner.run_analysis`), which also runs shards and Ray sweeps.
        options: the default options object the runner takes (``options.replace(**changes)`` returns a validated
            copy); ``None`` for analyses without options.
        cli_options: the flags that set fields of ``options`` (``relaylens run NAME --FLAG VALUE``).
        cli_panel: the help panel the flags are listed under in ``relaylens run --help``.
        batch_rows: the default of ``--batch-rows`` (``None``: every row of a record in one batch).
        doc: the analysis module's docstring.
    """

    spec: Any
    presets: Mapping[str, Any] = field(default_factory=dict)
    run: Callable[..., Any] | None = None
    options: Any = None
    cli_options: tuple[CliOption, ...] = ()
    cli_panel: str = ""
    batch_rows: int | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        name = getattr(self.spec, "name", "?")
        object.__setattr__(self, "presets", dict(self.presets))
        object.__setattr__(self, "cli_options", tuple(self.cli_options))
        object.__setattr__(self, "doc", (self.doc or "").strip())
        if self.run is not None and not callable(self.run):
            raise RelaylensError(f"analysis {name!r}: run must be callable (spec, config, options); got {self.run!r}")
        if self.options is not None and self.run is None:
            raise RelaylensError(f"analysis {name!r} has options but no runner of its own to take them (the sweep "
                                 "runner takes none). Fix: pass run=your_runner, or drop options")
        if self.cli_options and self.options is None:
            raise RelaylensError(f"analysis {name!r} declares flags ({', '.join(o.flag for o in self.cli_options)}) "
                                 "but no options object for them to set. Fix: pass options=YourOptions()")
        if self.cli_options and not self.cli_panel:
            object.__setattr__(self, "cli_panel", f"{name} only")
        if self.batch_rows is not None and (not isinstance(self.batch_rows, int) or self.batch_rows < 1):
            raise RelaylensError(f"analysis {name!r}: batch_rows must be a whole number >= 1 or None; got "
                                 f"{self.batch_rows!r}")

    @property
    def name(self) -> str:
        return self.spec.name

    def with_flags(self, values: Mapping[str, Any]):
        """:attr:`options` with the given flag values (by :attr:`CliOption.name`; ``None``: left at the default)
        applied and validated; ``None`` for an analysis without options."""
        if self.options is None:
            return None
        by_name = {o.name: o for o in self.cli_options}
        unknown = sorted(set(values) - set(by_name))
        if unknown:
            raise RelaylensError(f"analysis {self.name!r} has no option {', '.join(unknown)}; it takes "
                                 f"{', '.join(by_name) or 'none'}")
        return self.options.replace(**{by_name[k].field: v for k, v in values.items() if v is not None})

    # --- module-style aliases of the records' fields (load_analysis returned the module before) ----------------------

    def _alias(self, old: str, new: str):
        warnings.warn(f"load_analysis(...).{old} is deprecated and will be removed in relaylens {REMOVED_IN}; use "
                      f".{new}", DeprecationWarning, stacklevel=3)
        return getattr(self, new)

    @property
    def SPEC(self):
        """Deprecated alias of :attr:`spec`."""
        return self._alias("SPEC", "spec")

    @property
    def PRESETS(self):
        """Deprecated alias of :attr:`presets`."""
        return self._alias("PRESETS", "presets")

    @property
    def RUN(self):
        """Deprecated alias of :attr:`run`."""
        return self._alias("RUN", "run")

    @property
    def OPTIONS(self):
        """Deprecated alias of :attr:`options`."""
        return self._alias("OPTIONS", "options")

    @property
    def BATCH_ROWS(self):
        """Deprecated alias of :attr:`batch_rows`."""
        return self._alias("BATCH_ROWS", "batch_rows")


def __getattr__(name: str):  # old names of this module (relaylens.MOVED_NAMES), until relaylens.REMOVED_IN
    return moved_name(__name__, name)
