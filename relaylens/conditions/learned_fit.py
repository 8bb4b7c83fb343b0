"""Where a learned geometry (``learned:RUN_DIR``) applies: the model and the fit settings it was learned under,
checked by one set of functions for ``relaylens run`` (:func:`relaylens.experiments.learned.check_learned_conditions`)
and for the integrations (``relay_generate`` / ``relay_inputs``, the lm-eval model, the TransformerLens export).

A learned geometry applies only where its fit's selection and prompts hold: the same model (every weights or config
hash both sides record agrees) and the same :data:`FIT_FIELDS` (selector, budget, selector options, protected
framing, prompt mode, evidence granularity, window mode). A caller passes the settings it has; a setting the
caller does not have (the lm-eval model renders no relaylens prompt: no prompt mode, no granularity) is not compared.

Example:
    >>> from relaylens.conditions.family import Learned
    >>> part = Learned.from_info({"parameters": {"b": 1.0, "s": 1.0, "alpha": 1.0},
    ...                           "fit": {"selector": "snapkv", "budget": 0.1}}, "runs/learned")
    >>> check_learned_settings(part, {"selector": "snapkv", "budget": 0.1}, "this call")
    >>> check_learned_settings(part, {"selector": "h2o", "budget": 0.1}, "this call")
    Traceback (most recent call last):
    ...
    relaylens.errors.RelaylensError: condition learned:runs/learned was fitted under other settings: selector (learned with 'snapkv', this call 'h2o'). A learned geometry applies only where its fit's selection and prompts hold. Fix: use the learned settings, or learn a geometry with these (relaylens run learned_geometry ...)
"""  # noqa: E501 - doctest: an exception message is matched on one line

from __future__ import annotations

import json
from pathlib import Path

from relaylens.conditions.family import Learned
from relaylens.errors import RelaylensError

__all__ = ["FIT_FIELDS", "learned_fit", "check_learned_model", "check_learned_settings", "learned_parts_of"]

FIT_FIELDS = ("selector", "budget", "selector_options", "protect_instructions", "prompt_mode", "granularity",
              "window_mode")
"""The settings a learned geometry's fit depended on besides the model (recorded in ``learned_geometry.json`` under
``fit``; ``learned:RUN_DIR`` elsewhere must match every one of them and the model)."""


def learned_parts_of(condition) -> list[Learned]:
    """The ``learned:RUN_DIR`` parts of a parsed condition (itself, or a scoped condition's inside and base)."""
    parts = [condition, getattr(condition, "inner", None), getattr(condition, "base", None)]
    return [p for p in parts if isinstance(p, Learned)]


def learned_fit(part: Learned) -> dict:
    """What the fit of ``part`` depended on: the file's ``fit``, else (files written before it was recorded) the
    file's own fields and the spec in ``RUN_DIR/manifest.json``."""
    info = part.info
    if isinstance(info.get("fit"), dict):
        return info["fit"]
    spec, run = {}, {}
    try:
        manifest = json.loads((Path(part.run_dir) / "manifest.json").read_text("utf-8"))
        spec, run = manifest["config"]["spec"], manifest["config"]["run"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    selector = info.get("selector", (spec.get("selectors") or [None])[0])
    options = (spec.get("selector_options") or {}).get(selector, {}) if "selector_options" in spec else None
    return {"selector": selector, "budget": info.get("budget"), "selector_options": options,
            "protect_instructions": bool(spec.get("protect_instructions", False)) if spec else None,
            "prompt_mode": info.get("prompt_mode", spec.get("prompt_mode")), "granularity": spec.get("granularity"),
            "window_mode": run.get("window_mode")}


def check_learned_model(part: Learned, this_model: dict, who: str = "this run") -> None:
    """The model: every hash both sides record agrees (``weights_hash``, ``config_sha256``); without a common hash,
    the model names (``spec``) must agree."""
    label, info = part.label, part.info
    learned_model = info.get("model") or {}
    common = [f for f in ("weights_hash", "config_sha256") if learned_model.get(f) and this_model.get(f)]
    for field_name in common:
        if learned_model[field_name] != this_model[field_name]:
            raise RelaylensError(f"condition {label} was learned on model {learned_model.get('spec')} "
                                 f"({field_name} {str(learned_model[field_name])[:12]}); {who} uses "
                                 f"{this_model.get('spec')} ({str(this_model[field_name])[:12]}). Fix: learn a "
                                 "geometry for this model (relaylens run learned_geometry --model ...)")
    if not common and learned_model.get("spec") != this_model.get("spec"):
        raise RelaylensError(f"condition {label} was learned on model {learned_model.get('spec')!r}; {who} uses "
                             f"{this_model.get('spec')!r} and no weights or config hash is recorded on both sides to "
                             "prove them the same. Fix: learn a geometry for this model")


def _same(name: str, learned, here) -> bool:
    if name == "budget" and learned is not None and here is not None and not isinstance(here, (list, str)):
        return float(learned) == float(here)
    return learned == here


def check_learned_settings(part: Learned, here: dict, who: str = "this run") -> None:
    """Every :data:`FIT_FIELDS` setting in ``here`` equals the fit's, or the condition is refused naming each
    difference (a setting the learned file does not record counts as a difference; one ``here`` lacks is not
    compared)."""
    learned = learned_fit(part)
    differ = [f"{name} (learned with {learned.get(name)!r}, {who} {here[name]!r})"
              for name in FIT_FIELDS if name in here and not _same(name, learned.get(name), here[name])]
    if differ:
        raise RelaylensError(f"condition {part.label} was fitted under other settings: {'; '.join(differ)}. A learned "
                             "geometry applies only where its fit's selection and prompts hold. Fix: use the learned "
                             "settings, or learn a geometry with these (relaylens run learned_geometry ...)")
