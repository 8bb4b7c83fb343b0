"""relaylens: post-selection positional geometry of sparse KV caches (RoPERelay, coordinate conditions and
evidence-reading probes for Hugging Face models).

The package reads like the data flow, one subpackage per stage::

    datasets -> model -> selectors -> geometry / conditions -> generation -> probes -> scoring -> results -> reporting
                                                  experiments, integrations, bench, cli/ on top; errors.py, testing.py
                                                  here

The documented API is importable from here (``from relaylens import load_model, prefill_history, ...``); each name
lives in the module of its stage, listed below. Names load on first use, so ``import relaylens`` stays light and
figures or reports built from result tables never import torch.

================ ====================================================================================================
stage            names (module)
================ ====================================================================================================
records          ``Record``, ``Session``, ``Turn`` (datasets.records); ``load_records``, ``load_records_with_report``,
                 ``bundled_sample_path`` (datasets); ``generate_records`` (datasets.synthetic); ``pull_real_data``,
                 ``real_data_path`` (datasets.real_data); ``build_haystacks``, ``write_haystacks`` (datasets.haystack)
model, prompt    ``load_model``, ``load_tokenizer`` (model.loading); ``render_prompt`` (datasets.prompting)
prefill          ``prefill_history``, ``PrefillResult`` (model.prefill)
selection        ``make_selector``, ``Selector`` (selectors); ``Selection`` (geometry.selection);
                 ``select_protected`` (selectors.protection: instruction and template states kept outside the budget)
conditions       ``Condition`` (conditions.catalogue); ``get_condition`` (conditions.scoped); ``RotaryFactors``,
                 ``relocate_keys`` (geometry.rotary)
question pass    ``build_cache`` (generation.cache); ``run_condition`` (generation.single); ``GenerationResult``
                 (generation.rows)
probes           ``probe_condition``, ``replay_conditions``, ``FinalTokenRecorder`` (probes.readouts)
integrations     ``relay_generate`` (integrations.hf_generate: Hugging Face ``generate()`` under a condition)
scoring          ``score_answer`` (scoring.metrics); ``ChecklistJudge`` (scoring.checklist: HelloEval checklists)
sweeps           ``ExperimentSpec``, ``load_analysis``, ``available_analyses`` (experiments.specs); ``RunConfig``
                 (experiments.config), ``run_analysis`` (experiments.runner); ``RunStore``, ``load_tables``
                 (results.store)
tables, figures  ``example_tables`` (results.tables); ``accuracy_table``, ``layer_table`` (reporting.summaries);
                 ``write_figures`` (reporting.figures); ``render_report``, ``write_report`` (reporting.report)
errors           ``RelaylensError`` (errors)
================ ====================================================================================================

Legacy: module paths of the flat layout (``relaylens.records``, ``relaylens.rows``, ``relaylens.scopes``, ...) and the
names a stage face re-exported from the flat module it replaced (``relaylens.geometry.rotate_keys``, ...) keep
importing through one legacy table (:data:`MOVED`, :data:`MOVED_NAMES`) until relaylens :data:`REMOVED_IN`, each with a
``DeprecationWarning`` that names the new home and the removal version. Each stage face exports its own contract.

Example:
    >>> import relaylens
    >>> relaylens.get_condition("relay").name, "load_model" in relaylens.__all__
    ('relay', True)
    >>> MOVED["rows"], REMOVED_IN
    (('generation.rows',), '0.3.0')
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
import warnings

__version__ = "0.1.0"

_HOMES = {
    "datasets.records": ("Record", "Session", "Turn"),
    "datasets": ("load_records", "load_records_with_report", "bundled_sample_path"),
    "datasets.synthetic": ("generate_records",),
    "datasets.real_data": ("pull_real_data", "real_data_path"),
    "datasets.haystack": ("build_haystacks", "write_haystacks"),
    "model.loading": ("load_model", "load_tokenizer"),
    "datasets.prompting": ("render_prompt",),
    "model.prefill": ("prefill_history", "PrefillResult"),
    "selectors": ("make_selector", "Selector"),
    "geometry.selection": ("Selection",),
    "selectors.protection": ("select_protected",),
    "conditions.catalogue": ("Condition",),
    "conditions.scoped": ("get_condition",),
    "geometry.rotary": ("RotaryFactors", "relocate_keys"),
    "generation.cache": ("build_cache",),
    "generation.single": ("run_condition",),
    "generation.rows": ("GenerationResult",),
    "probes.readouts": ("probe_condition", "replay_conditions", "FinalTokenRecorder"),
    "integrations.hf_generate": ("relay_generate",),
    "scoring.metrics": ("score_answer",),
    "scoring.checklist": ("ChecklistJudge",),
    "experiments.specs": ("ExperimentSpec", "load_analysis", "available_analyses"),
    "experiments.config": ("RunConfig",),
    "experiments.runner": ("run_analysis",),
    "results.store": ("RunStore", "load_tables"),
    "results.tables": ("example_tables",),
    "reporting.summaries": ("accuracy_table", "layer_table"),
    "reporting.figures": ("write_figures",),
    "reporting.report": ("render_report", "write_report"),
    "errors": ("RelaylensError",),
}
_EXPORTS = {name: f"relaylens.{module}" for module, names in _HOMES.items() for name in names}

__all__ = sorted(_EXPORTS)

# ------------------------------------------------------------------------------------------------------- legacy
# The one legacy table: what moved in the layout by stage (0.1.0), served with a DeprecationWarning that names the new
# home and REMOVED_IN. In the release numbered REMOVED_IN this section goes (with the finder below, the face
# ``__getattr__`` hooks calling moved_name, and tests/test_legacy.py's alias tests); tests/test_legacy.py fails
# once __version__ reaches it with the table still here.
REMOVED_IN = "0.3.0"

# Module paths of the flat layout that no longer exist -> their new home(s), relative to ``relaylens``. A module that
# was split lists every part; its old path then resolves names in that order. Paths that became packages
# (relaylens.geometry, .generation, .probes, .scoring, .results, .experiments, .bench) import directly: their face
# exports the stage contract, and the flat module's other names are in MOVED_NAMES.
MOVED: dict[str, tuple[str, ...]] = {
    "records": ("datasets.records", "datasets"),
    "prompting": ("datasets.prompting",),
    "spans": ("datasets.spans",),
    "prompt_templates": ("datasets.prompt_templates",),
    "models": ("model.loading", "model.embedded"),
    "placement": ("model.placement",),
    "hf": ("model.hf",),
    "prefill": ("model.prefill",),
    "attention_stats": ("model.attention_stats",),
    "protection": ("selectors.protection",),
    "selectors.memory": ("bench.selector_memory",),
    "selection": ("geometry.selection",),
    "kernels": ("geometry.fused",),
    "fused_kernel": ("geometry.numba_source",),
    "scopes": ("conditions.scoped",),
    "attention": ("generation.attention",),
    "relocation": ("generation.cache",),
    "rows": ("generation.rows",),
    "attribution": ("probes.attribution",),
    "probes_tl": ("probes.transformer_lens",),
    "layer_sweep": ("probes.layer_sweep",),
    "views": ("probes.token_view", "results.views", "reporting.token_view"),
    "judge": ("scoring.judge",),
    "checklist": ("scoring.checklist",),
    "rejudge": ("experiments.rejudge",),
    "agreement": ("scoring.agreement",),
    "tables": ("results.tables",),
    "shards": ("results.shards",),
    "atomic": ("results.atomic",),
    "locks": ("results.locks",),
    "summaries": ("reporting.summaries", "conditions.bands"),
    "bootstrap": ("reporting.bootstrap",),
    "retention": ("reporting.retention",),
    "crossrun": ("reporting.crossrun",),
    "plots": ("reporting.plots",),
    "figures": ("reporting.figures",),
    "report": ("reporting.report",),
    "htmlsafe": ("reporting.htmlsafe",),
    "overhead": ("reporting.overhead",),
    "presets": ("experiments.presets",),
    "runner": ("experiments.runner", "experiments.summary"),
    "launch": ("experiments.launch",),
    "sweep": ("experiments.sweep",),
    "demo": ("experiments.demo",),
    "bench_model": ("bench.model",),
    "bench_requests": ("bench.requests",),
    "checks": ("bench.checks",),
}

# Names a module no longer defines under that name: module -> {home: names} (relative to ``relaylens``; home ``""``:
# ``relaylens`` itself). A stage face lists what it re-exported from the flat module it replaced; a module lists its
# own old names. ``"NEW as OLD"`` is a renamed one (read it as ``from home import NEW as OLD``).
# ``relaylens.<module>.<OLD>`` still resolves, through the module's ``__getattr__`` (one line calling
# :func:`moved_name`), with the warning.
MOVED_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "geometry": {"geometry.rotary": ("DYNAMIC_ROPE_TYPES", "NOPE", "STATIC_ROPE_TYPES", "multiply_planes",
                                     "rotate_keys", "unrotate_keys"),
                 "geometry.selection": ("PAD_POSITION",)},
    "generation": {"generation.single": ("prefill_from_cache",)},
    # probes.readouts: the flat module's function ``readouts`` shares its name with the submodule, so the face keeps
    # the function bound (as before) and it resolves without a warning until REMOVED_IN
    "probes": {"probes.readouts": ("ProbedCondition", "ReplayContent", "phase_replay", "probe_rows",
                                   "replay_content")},
    "scoring": {"scoring.metrics": ("ANSWER_METRICS as METRICS", "contains", "exact_match", "extract_choice_personamem",
                                    "f1", "infinitebench_choice_correct", "infinitebench_dialogue_correct",
                                    "is_abstention", "personamem_choice_correct")},
    "results": {"results.store": ("UNITS", "StoreWriteError", "UnitKey", "load_run", "prepare_run_dir"),
                "results.manifest": ("FORMAT_VERSION", "ResultStoreError", "manifest_diff", "manifest_section",
                                     "source_state"),
                "fileio": ("file_sha256",)},
    "experiments": {"experiments.specs": ("ALPHA_CURVE", "ANALYSES_PACKAGE", "PROMPT_MODES", "STOPS", "apply_overrides",
                                          "parse_selector_arg")},
    "bench": {"bench.geometry": ("LLAMA31_8B", "SMOLLM2", "CacheShape", "bench_delta_rotation_error",
                                 "bench_relocation", "interleaved_medians", "min_cpu_seconds", "rotary_only_model",
                                 "run_geometry", "write_results")},
    # old names inside a module (issue 53: the silent aliases, now with the warning and the one removal version)
    "scoring.metrics": {"scoring.metrics": ("ANSWER_METRICS as METRICS",)},
    "scoring.checklist": {"scoring.checklist": ("CHECKLIST_METRICS as METRICS",)},
    "reporting.summaries": {"reporting.summaries": ("FALLBACK_METRICS as METRICS",)},
    "geometry.fused": {"geometry.fused": ("relocate_key_rows as relocate_rows",)},
    "probes.sensitivity": {"results.tables": ("SENSITIVITY_METRICS as SENSITIVITY_READOUTS",)},
    "experiments.specs": {"results.tables": ("split_unit_label as split_unit_selector",)},
    "experiments.runner": {"experiments.judges": ("make_judge",), "datasets": ("SAMPLE", "resolve_data"),
                           # the one unit walk and the decode corridor left the runner (issue 53, item 1)
                           "experiments.walk": ("PREFILL_REUSE_FILE", "PrefillReuse", "answer_tokens",
                                                "first_answer_token", "history_problem", "prefill_reuse_enabled",
                                                "skip_unit"),
                           "experiments.record_rows": ("first_token_end_probability",),
                           "experiments.units": ("UnitWork", "prefill_record", "query_window", "select_units",
                                                 "selector_objects")},
    "results.store": {"results.manifest": ("FORMAT_VERSION", "source_state")},
    "experiments.analysis": {"": ("REMOVED_IN as ALIAS_REMOVAL",)},  # one removal version
}


def legacy_names(module: str) -> dict[str, tuple[str, str]]:
    """The old names ``relaylens.<module>`` still serves (:data:`MOVED_NAMES`): old name -> ``(home, name there)``.

    >>> legacy_names("scoring.metrics")
    {'METRICS': ('scoring.metrics', 'ANSWER_METRICS')}
    """
    served = {}
    for home, names in MOVED_NAMES.get(module, {}).items():
        for entry in names:
            new, _, old = entry.partition(" as ")
            served[old or new] = (home, new)
    return served


def _moved_warning(old: str, new: str) -> str:
    return (f"{old} moved to {new}; import it from there (the old path is an alias removed in relaylens {REMOVED_IN})")


def moved_name(face: str, name: str):
    """``relaylens.<face>.<name>`` for a name the module ``face`` no longer exports (:data:`MOVED_NAMES`): the object
    of its new home, with a ``DeprecationWarning``; an ``AttributeError`` for any other name. The module's
    ``__getattr__`` calls it.

    >>> moved_name("relaylens.geometry", "nothing_here")
    Traceback (most recent call last):
    ...
    AttributeError: module 'relaylens.geometry' has no attribute 'nothing_here'
    """
    served = legacy_names(face.partition(".")[2]).get(name)
    if served is None:
        raise AttributeError(f"module {face!r} has no attribute {name!r}")
    home, new = served
    module = f"{__name__}.{home}" if home else __name__  # home "": this package's own face
    warnings.warn(_moved_warning(f"{face}.{name}", f"{module}.{new}"), DeprecationWarning,
                  stacklevel=_caller_stacklevel() + 1)  # + 1: the face's __getattr__
    return getattr(importlib.import_module(module), new)


def moved_home(fullname: str) -> tuple[str, ...] | None:
    """The new home(s) of a module path of the flat layout (``relaylens.figures.registry`` included: a moved
    package's submodules move with it), or None for a path that was not moved.

    >>> moved_home("relaylens.figures.registry"), moved_home("relaylens.geometry")
    (('relaylens.reporting.figures.registry',), None)
    """
    head, _, rest = fullname.partition(".")
    if head != __name__ or not rest:
        return None
    for old, homes in MOVED.items():
        if rest == old:
            return tuple(f"{__name__}.{home}" for home in homes)
        if rest.startswith(old + ".") and len(homes) == 1:
            return (f"{__name__}.{homes[0]}{rest[len(old):]}",)
    return None


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside the import machinery and this file, so that the warning points at
    the user's import line (and shows by default when that is ``__main__``). ``warnings`` skips importlib's own
    frames itself, so only the others are counted."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_filename == __file__):
        if frame.f_code.co_filename == __file__:
            level += 1
        frame = frame.f_back
    return level


class _MovedModules:
    """Imports an old module path as its new home (the same module object), warning once per path: a meta-path finder
    and loader by protocol (``find_spec`` / ``create_module`` / ``exec_module``; subclassing ``importlib.abc`` would
    import ``importlib.resources``, ``pathlib`` and ``tempfile`` with every ``import relaylens``)."""

    def find_spec(self, fullname, path=None, target=None):
        if moved_home(fullname) is None:
            return None

        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        homes = moved_home(spec.name)
        warnings.warn(_moved_warning(spec.name, " + ".join(homes)), DeprecationWarning, stacklevel=_caller_stacklevel())
        if len(homes) == 1:
            return importlib.import_module(homes[0])
        parts = [importlib.import_module(home) for home in homes]
        facade = types.ModuleType(spec.name, f"Alias of {', '.join(homes)} (a split module of the flat layout).")

        def lookup(name: str):
            for part in parts:
                if hasattr(part, name):
                    return getattr(part, name)
            raise AttributeError(f"module {spec.name!r} (now {', '.join(homes)}) has no attribute {name!r}")

        facade.__getattr__ = lookup
        facade.__dir__ = lambda: sorted({n for part in parts for n in dir(part)})
        return facade

    def exec_module(self, module):
        """Nothing to run: the module object is the already imported new home (or the facade over its parts)."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())  # before the path finder: a stale folder of an old path never wins


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in MOVED:  # relaylens.rows after a bare ``import relaylens``: the alias, with its warning
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'relaylens' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
