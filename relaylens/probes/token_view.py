"""Token-view capture: per (record, selector, budget), the history tokens as text, the gold-evidence mask, and per
layer the positions kept by at least one kv head (``kept``) with, per condition, the final question token's
attention on them averaged over query heads (a head whose kv head evicted a token contributes 0). Evicted tokens carry
no attention by construction. Sizes stay bounded: ``layers x kept`` numbers per condition, never ``L x L``.

The run stores each view as JSON (:mod:`relaylens.results.views`); :mod:`relaylens.reporting.token_view` renders
them (the report embeds them; ``show_view`` displays them in a notebook). Axes: :mod:`relaylens.geometry`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relaylens.probes.unit import ProbeTables, UnitContext


def final_token_attention(recorder, selection, history_length: int) -> dict[int, torch.Tensor]:
    """``layer -> [L]`` float32: the final question token's attention on each history position, mean over query
    heads."""
    out = {}
    for layer in sorted(recorder.rows):
        width = recorder.widths[layer]
        row = recorder.rows[layer][:, :width].float()  # [q_head, slot]
        q_heads = row.shape[0]
        kv_heads = selection.positions.shape[1]
        kv_of = torch.arange(q_heads) // (q_heads // kv_heads)
        valid = selection.valid[layer, :, :width][kv_of]  # [q_head, slot]
        positions = selection.positions[layer, :, :width].clamp_min(0)[kv_of]  # [q_head, slot]
        weights = torch.zeros(history_length)
        weights.index_add_(0, positions[valid], row[valid])
        out[layer] = weights / q_heads
    return out


def token_strings(tokenizer, ids: torch.Tensor) -> list[str]:
    """Each history token decoded on its own (what the view prints)."""
    return [tokenizer.decode([int(i)]) for i in ids.reshape(-1).tolist()]


def token_view(prompt, tokenizer, selection, granularity: str, recorders: dict[str, object], key: dict) -> dict:
    """The stored view of one (record, selector, budget): ``recorders`` maps condition -> FinalTokenRecorder."""
    length = prompt.history_length
    kept = []  # per layer: positions kept by at least one kv head, ascending
    for layer in range(selection.positions.shape[0]):
        kept.append(torch.unique(selection.positions[layer][selection.valid[layer]]).tolist())
    attention = {}
    for condition, recorder in recorders.items():
        per_layer = final_token_attention(recorder, selection, length)
        attention[condition] = [[float(f"{float(per_layer[l][p]):.4g}") for p in kept[l]] for l in sorted(per_layer)]
    gold = prompt.evidence_mask(granularity)
    return {
        **key, "tokens": token_strings(tokenizer, prompt.history_ids),
        "gold": [int(i) for i in gold.nonzero().flatten()],
        "kept": kept, "attention": attention, "granularity": granularity,
    }


@dataclass(frozen=True)
class TokenViewProbe:
    """The probe kind ``token_view`` (:mod:`relaylens.probes.registry`): the unit's view, for the records whose view
    is due (``unit.views``) and whose forward probes ran (their recorders hold the attention rows)."""

    name: str = "token_view"

    def enabled(self, spec, config) -> bool:
        return bool(spec.probes)

    def run(self, unit: UnitContext) -> ProbeTables:
        if not unit.views or not unit.probed:
            return ProbeTables()
        recorders = {label: probed.question_recorder for label, probed in unit.probed.items()}
        return ProbeTables(view=token_view(unit.prompt, unit.tokenizer, unit.selection, unit.spec.granularity,
                                           recorders, dict(unit.key)))


TOKEN_VIEW = TokenViewProbe()
