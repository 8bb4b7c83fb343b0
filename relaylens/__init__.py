"""relaylens: post-selection positional geometry of sparse KV caches (RoPERelay, coordinate conditions and
evidence-reading probes for Hugging Face models).

The documented API is importable from here (``from relaylens import load_model, prefill_history, ...``); each name
lives in the module of its stage, listed below. Names load on first use, so ``import relaylens`` stays light and
figures or reports built from result tables never import torch.

================ ====================================================================================================
stage            names (module)
================ ====================================================================================================
records          ``Record``, ``Session``, ``Turn`` (records); ``load_records``, ``load_records_with_report``,
                 ``bundled_sample_path`` (datasets); ``generate_records`` (datasets.synthetic)
model, prompt    ``load_model``, ``load_tokenizer`` (models); ``render_prompt`` (prompting)
prefill          ``prefill_history``, ``PrefillResult`` (prefill)
selection        ``make_selector``, ``Selector`` (selectors); ``Selection`` (selection); ``select_protected``
                 (protection: instruction and template states kept outside the budget)
conditions       ``Condition`` (conditions); ``get_condition`` (scopes); ``RotaryFactors``, ``relocate_keys`` (geometry)
question pass    ``build_cache`` (relocation); ``run_condition`` (generation); ``GenerationResult`` (rows)
probes           ``probe_condition``, ``replay_conditions``, ``FinalTokenRecorder`` (probes)
scoring          ``score_answer`` (scoring); ``ChecklistJudge`` (checklist: HelloEval checklist judging)
sweeps           ``ExperimentSpec``, ``load_analysis``, ``available_analyses`` (experiments); ``RunConfig``,
                 ``run_analysis`` (runner); ``RunStore``, ``load_tables`` (results)
tables, figures  ``example_tables`` (tables); ``accuracy_table``, ``layer_table`` (summaries); ``write_figures``
                 (figures); ``render_report``, ``write_report`` (report)
errors           ``RelaylensError`` (errors)
================ ====================================================================================================

Example:
    >>> import relaylens
    >>> relaylens.get_condition("relay").name, "load_model" in relaylens.__all__
    ('relay', True)
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_HOMES = {
    "records": ("Record", "Session", "Turn"),
    "datasets": ("load_records", "load_records_with_report", "bundled_sample_path"),
    "datasets.synthetic": ("generate_records",),
    "models": ("load_model", "load_tokenizer"),
    "prompting": ("render_prompt",),
    "prefill": ("prefill_history", "PrefillResult"),
    "selectors": ("make_selector", "Selector"),
    "selection": ("Selection",),
    "protection": ("select_protected",),
    "conditions": ("Condition",),
    "scopes": ("get_condition",),
    "geometry": ("RotaryFactors", "relocate_keys"),
    "relocation": ("build_cache",),
    "generation": ("run_condition",),
    "rows": ("GenerationResult",),
    "probes": ("probe_condition", "replay_conditions", "FinalTokenRecorder"),
    "scoring": ("score_answer",),
    "checklist": ("ChecklistJudge",),
    "experiments": ("ExperimentSpec", "load_analysis", "available_analyses"),
    "runner": ("RunConfig", "run_analysis"),
    "results": ("RunStore", "load_tables"),
    "tables": ("example_tables",),
    "summaries": ("accuracy_table", "layer_table"),
    "figures": ("write_figures",),
    "report": ("render_report", "write_report"),
    "errors": ("RelaylensError",),
}
_EXPORTS = {name: f"relaylens.{module}" for module, names in _HOMES.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'relaylens' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
