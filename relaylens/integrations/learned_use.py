"""A learned geometry (``learned:RUN_DIR``) inside the integrations: refused outside its fit exactly as ``relaylens
run`` refuses it (:mod:`relaylens.conditions.learned_fit`: the same model by weights hash, the same selector,
budget, selector options, framing regime and window mode, and the prompt mode and granularity where the caller
renders prompts), and identified by its content hash for what the integration records.

Example:
    >>> from relaylens.conditions.scoped import get_condition
    >>> from relaylens.testing import tiny_model
    >>> check_learned_use(get_condition("relay"), tiny_model("llama"), "relay_generate", selector="snapkv") is None
    True
"""

from __future__ import annotations

from relaylens.conditions.learned_fit import check_learned_model, check_learned_settings, learned_parts_of
from relaylens.model.loading import model_fingerprint
from relaylens.selectors.arguments import parse_selector_arg
from relaylens.selectors.base import Budget

__all__ = ["check_learned_use", "selector_name"]


def selector_name(selector) -> str:
    """The registry name of a selector given as a name (``SnapKV``, ``h2o:recent_size=4``) or as a ``Selector``."""
    return parse_selector_arg(selector)[0] if isinstance(selector, str) else selector.name


def check_learned_use(condition, model, who: str, **settings) -> str | None:
    """Refuse every ``learned:`` part of ``condition`` that was learned on another model or under other settings
    than ``settings`` (any of :data:`~relaylens.conditions.learned_fit.FIT_FIELDS`; a setting left out or None is
    not compared); return the learned file's content SHA-256 (``;``-joined for several parts), or None without one.

    ``settings``: ``selector`` (a name or a ``Selector``), ``budget`` (a ratio, states or a ``Budget``),
    ``selector_options`` (the options given with the name), ``protect_instructions`` (the framing regime),
    ``prompt_mode``, ``granularity``, ``window_mode``. The model is identified by its weights hash (one pass over the
    weights, only when the condition holds a learned part), as the run's manifest records it.
    """
    parts = learned_parts_of(condition)
    if not parts:
        return None
    here = {name: value for name, value in settings.items() if value is not None}
    if "selector" in here:
        here["selector"] = selector_name(here["selector"])
    if "budget" in here:
        budget = Budget.coerce(here["budget"])
        here["budget"] = budget.ratio if budget.ratio is not None else float(budget.states)
    if "protect_instructions" in here:
        here["protect_instructions"] = bool(here["protect_instructions"])
    this_model = {"weights_hash": model_fingerprint(model), "spec": getattr(model, "name_or_path", None)}
    for part in parts:
        check_learned_model(part, this_model, who)
        check_learned_settings(part, here, who)
    return ";".join(part.sha256 for part in parts)
