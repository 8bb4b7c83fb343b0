"""Named configurations of an analysis: ``--preset paper`` runs an analysis as the paper ran it.

Every analysis in ``relaylens/analyses/`` keeps a CPU-sized ``spec`` and a ``presets`` dict (its
:class:`~relaylens.experiments.analysis.Analysis` record); a preset changes spec fields only (selectors, budgets,
conditions, decoding, gold granularity, selector hyperparameters) and says which model and data size the paper used
(documentation: the model, data and device stay command-line choices, so ``--preset paper --limit 2`` runs on a CPU
with the embedded model). Source of the paper's settings: ``reference/paper-settings.md``.

Example:
    >>> from relaylens.experiments.specs import load_analysis
    >>> spec = apply_preset(load_analysis("coordinate_ablation"), "paper")
    >>> spec.selectors, spec.budgets, spec.max_new_tokens, spec.stop
    (('bm25',), (8192,), 512, 'eos')
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relaylens.errors import RelaylensError
from relaylens.experiments.analysis import Analysis

__all__ = ["Preset", "PAPER_DECODING", "SIX_SELECTORS", "apply_preset", "preset_rows", "preset_markdown"]

SIX_SELECTORS = ("bm25", "snapkv", "h2o", "pyramidkv", "chunkkv", "cam")
"""The paper's main-table selectors (Table 1, Figure 3, Table 12)."""

PAPER_DECODING = dict(max_new_tokens=512, stop="eos", prompt_mode="auto", granularity="session")
"""Memory-task decoding of the paper (greedy, at most 512 new tokens, stop at EOS, chat prompt where the model has
a template) and its gold evidence unit (LongMemEval-S ``answer_session_ids``: supporting sessions)."""

LLAMA = "Llama-3.1-8B-Instruct"
QWEN = "Qwen2-7B-Instruct (static YaRN x4, 131,072: --rope-scaling yarn:4:32768 --max-position 131072)"


@dataclass(frozen=True)
class Preset:
    """Spec changes plus what the paper ran them on.

    Attributes:
        changes: :class:`~relaylens.experiments.specs.ExperimentSpec` fields to replace.
        paper_model: the model(s) the paper used.
        paper_data: the dataset and size the paper used.
        metric: the paper's metric for this experiment (``judge``, ``choice_accuracy``, ``probes``, ``time``).
        notes: deviations and choices where the paper is silent.
    """

    changes: dict
    paper_model: str
    paper_data: str
    metric: str = "judge"
    notes: str = ""
    figures: tuple[str, ...] = field(default=())


def apply_preset(analysis: Analysis, name: str | None):
    """The analysis's spec with preset ``name`` applied and named in its ``preset`` field, so the manifest records
    which preset ran (``None``: the CPU-sized default). ``analysis`` is the record of
    :func:`~relaylens.experiments.specs.load_analysis` (an analysis module, which holds it as ``ANALYSIS``, also
    works)."""
    if not isinstance(analysis, Analysis):
        analysis = analysis.ANALYSIS
    spec = analysis.spec
    if name is None or name == "default":
        return spec
    if name not in analysis.presets:
        raise RelaylensError(f"analysis {spec.name!r} has no preset {name!r}; available: "
                             f"{', '.join(['default', *sorted(analysis.presets)])}")
    return spec.replace(**analysis.presets[name].changes, preset=name)


def _describe(spec) -> str:
    budgets = ", ".join(f"B{b}" if b > 1 else f"{b * 100:g}%" for b in spec.budgets)
    stop = spec.stop if spec.stop != "auto" else ("newline" if spec.prompt_mode == "completion" else "eos")
    if spec.protect_instructions:
        budgets += " of the source (instructions protected)"
    return (f"{'/'.join(spec.selectors)} @ {budgets}; {len(spec.conditions)} conditions; {spec.granularity} gold; "
            f"{spec.max_new_tokens} tok, stop {stop}, {spec.prompt_mode}; limit {spec.limit or 'all'}")


def preset_rows() -> list[dict]:
    """One row per analysis: CPU default vs paper preset vs the model and data the paper used."""
    from relaylens.experiments.specs import available_analyses, load_analysis  # noqa: PLC0415 - late binding (tests swap specs.load_analysis)

    rows = []
    for name in available_analyses():
        analysis = load_analysis(name)
        preset = analysis.presets.get("paper")
        rows.append({"analysis": name, "default": _describe(analysis.spec),
                     "paper preset": _describe(apply_preset(analysis, "paper")) if preset else "(none)",
                     "paper scale": f"{preset.paper_model}; {preset.paper_data}" if preset else "",
                     "metric": preset.metric if preset else ""})
    return rows


def preset_markdown() -> str:
    """:func:`preset_rows` as a Markdown table (the README's preset table)."""
    rows = preset_rows()
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows]
    return "\n".join(lines)
