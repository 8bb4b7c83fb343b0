"""Evidence-reading probes: how the final question token reads the retained gold evidence under each condition.

Axes: ``layer``, ``q_head``, ``slot``, ``head_dim`` (:mod:`relaylens.geometry`). Memory is O(layers x heads x retained
states): only the final token's attention row, the retained values and un-rotated query/key contents are kept, never a
full attention matrix.

Readouts per layer and query head (``a_i``: the final token's softmax weight on retained history state ``i``):

* ``evidence_share`` = ``sum_gold a_i``; ``history_share`` = ``sum_i a_i`` (the rest sits on question tokens);
* ``evidence_value_norm`` = ``|| sum_gold a_i v_i ||_2`` and ``evidence_weighted_value`` = ``sum_gold a_i ||v_i||``;
* ``best_gold_rank`` = 1 + the number of retained states with more weight than the best gold state (NaN: no gold);
* phase replay (:func:`phase_replay`): ``replay_gold_share`` (softmax over retained history keys only) and
  ``replay_gold_logit_gap`` (mean gold logit minus mean other logit), with content fixed and phases moved.

Layer bands and band tables of these readouts are statistics of the result tables: :mod:`relaylens.reporting.summaries`.

Example (which retained states are gold: history tokens 4..5 are evidence; padded slots never are):
    >>> sel = Selection.from_lists([[[0, 4, 7], [1, 5]]], history_length=8)
    >>> gold_slots(sel, torch.tensor([0, 0, 0, 0, 1, 1, 0, 0])).tolist()
    [[[False, True, False], [False, True, False]]]
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import pandas as pd
import torch

from relaylens.conditions.catalogue import Condition
from relaylens.conditions.scoped import expand_conditions, get_condition
from relaylens.errors import RelaylensError
from relaylens.geometry.rotary import RotaryFactors, rotate_keys, unrotate_keys
from relaylens.geometry.selection import Selection
from relaylens.model.prefill import PrefillResult
from relaylens.probes.attribution import final_residuals, grad_x_input, logit_attribution, target_log_prob
from relaylens.probes.unit import ProbeTables, UnitContext

READOUTS = ("evidence_share", "history_share", "evidence_value_norm", "evidence_weighted_value", "best_gold_rank")
"""The forward-pass readouts per (layer, query head): the ``metric`` values of ``source == "forward"`` probe rows."""
REPLAY_READOUTS = ("replay_gold_share", "replay_gold_logit_gap")
"""The phase-replay readouts (content fixed, each condition's phases re-applied): ``source == "replay"`` rows."""


def gold_slots(selection: Selection, evidence_mask: torch.Tensor) -> torch.Tensor:
    """``[layer, kv_head, slot]`` bool: retained states whose source token lies inside gold evidence."""
    evidence_mask = torch.as_tensor(evidence_mask, dtype=torch.bool).reshape(-1)
    if evidence_mask.numel() != selection.history_length:
        raise RelaylensError(
            f"evidence mask covers {evidence_mask.numel()} tokens but the history has {selection.history_length}; "
            "build it from the same rendered prompt"
        )
    if not bool(evidence_mask.any()):
        raise RelaylensError(
            "the record has no gold evidence annotations at this granularity (no has_answer turn / evidence "
            "session), so evidence readouts would be meaningless zeros; use annotated records or the other granularity"
        )
    return evidence_mask[selection.positions.clamp_min(0)] & selection.valid


@dataclass
class FinalTokenRecorder:
    """Attention observer keeping the final query token's row, query and the history values, per layer."""

    widths: dict[int, int] = field(default_factory=dict)  # layer -> history slots in the cache
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [q_head, key] float32
    queries: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [q_head, head_dim] post-rotary
    values: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [kv_head, slot, head_dim]

    def __call__(self, layer, query, key, value, probs, state) -> None:
        width = state.valid[layer].shape[-1] if layer in state.valid else 0
        self.widths[layer] = width
        self.rows[layer] = probs[0, :, -1].detach().float().cpu().clone()  # readouts are computed on the CPU
        self.queries[layer] = query[0, :, -1].detach().float().cpu().clone()
        self.values[layer] = value[0, :, :width].detach().float().cpu().clone()


def readouts(recorder: FinalTokenRecorder, selection: Selection, gold: torch.Tensor, groups: int) -> pd.DataFrame:
    """Readouts per (layer, q_head) from a recorded forward pass, as a long DataFrame (layer, head, metric, value)."""
    records = []
    for layer in sorted(recorder.rows):
        width = recorder.widths[layer]
        row = recorder.rows[layer][:, :width]  # [q_head, slot]
        kv_of = torch.arange(row.shape[0]) // groups  # q_head -> kv_head
        valid = selection.valid[layer, :, :width][kv_of]  # [q_head, slot]
        is_gold = gold[layer, :, :width][kv_of]  # [q_head, slot]
        values = recorder.values[layer][kv_of]  # [q_head, slot, head_dim]
        weights = row * valid
        gold_weights = weights * is_gold
        evidence_vector = torch.einsum("hs,hsd->hd", gold_weights, values)  # [q_head, head_dim]
        masked = weights.masked_fill(~valid, -1.0)
        best_gold = masked.masked_fill(~is_gold, -1.0).max(-1).values  # [q_head]
        rank = (masked > best_gold[:, None]).sum(-1).float() + 1
        rank = torch.where(is_gold.any(-1), rank, torch.full_like(rank, float("nan")))
        metrics = {
            "evidence_share": gold_weights.sum(-1),
            "history_share": weights.sum(-1),
            "evidence_value_norm": evidence_vector.norm(dim=-1),
            "evidence_weighted_value": (gold_weights * values.norm(dim=-1)).sum(-1),
            "best_gold_rank": rank,
        }
        for name, per_head in metrics.items():
            for head, value in enumerate(per_head.tolist()):
                records.append((layer, head, name, value))
    return pd.DataFrame(records, columns=["layer", "head", "metric", "value"])


@dataclass
class ReplayContent:
    """Un-rotated contents from one reference pass: the final token's query and the retained keys."""

    query_content: dict[int, torch.Tensor]  # layer -> [q_head, head_dim]
    key_content: dict[int, torch.Tensor]  # layer -> [kv_head, slot, head_dim]
    scaling: float
    groups: int


def replay_content(recorder: FinalTokenRecorder, reference_position: int, prefill: PrefillResult, selection: Selection,
                   factors: RotaryFactors) -> ReplayContent:
    """Strip the phases: the query at ``reference_position`` and the cached keys at their source positions."""
    if prefill.kept is not None:
        raise RelaylensError("phase replay reads the cached keys at their source positions from the whole prefill; "
                             "this one was compacted to one selection's kept states (keep_selected). Fix: pass the "
                             "whole prefill")
    queries, keys = {}, {}
    for layer, query in recorder.queries.items():
        layer_arg = layer if factors.per_layer else None
        queries[layer] = unrotate_keys(query, torch.tensor(reference_position), factors, layer_arg)
        source = selection.positions[layer].clamp_min(0)  # [kv_head, slot]
        index = source[..., None].expand(-1, -1, prefill.keys[layer].shape[-1]).to(prefill.keys[layer].device)
        cached = prefill.keys[layer].gather(1, index).float().cpu()  # [kv_head, slot, head_dim]
        keys[layer] = unrotate_keys(cached, source, factors, layer_arg)  # [kv_head, slot, head_dim]
    return ReplayContent(queries, keys, prefill.scaling, prefill.num_key_value_groups)


def phase_replay(content: ReplayContent, selection: Selection, gold: torch.Tensor, condition: str | Condition,
                 num_question_tokens: int, factors: RotaryFactors) -> pd.DataFrame:
    """Gold share of the softmax over retained history keys with the condition's phases; no forward pass."""
    coords = get_condition(condition).coordinates(selection)
    query_position = torch.tensor(coords.question_start + num_question_tokens - 1)
    records = []
    for layer, query_content in sorted(content.query_content.items()):
        layer_arg = layer if factors.per_layer else None
        valid = selection.valid[layer]  # [kv_head, slot]
        key_positions = torch.where(valid, coords.key_positions[layer], 0)
        keys = rotate_keys(content.key_content[layer], key_positions, factors, layer_arg)  # [kv_head, slot, D]
        query = rotate_keys(query_content, query_position, factors, layer_arg)  # [q_head, D]
        kv_of = torch.arange(query.shape[0]) // content.groups
        logits = torch.einsum("hd,hsd->hs", query, keys[kv_of]) * content.scaling  # [q_head, slot]
        head_valid, head_gold = valid[kv_of], gold[layer][kv_of]
        probs = torch.softmax(logits.masked_fill(~head_valid, float("-inf")), dim=-1)
        share = (probs * head_gold).sum(-1)
        other = head_valid & ~head_gold
        gold_mean = (logits * head_gold).sum(-1) / head_gold.sum(-1).clamp_min(1)
        other_mean = (logits * other).sum(-1) / other.sum(-1).clamp_min(1)
        gap = torch.where(head_gold.any(-1) & other.any(-1), gold_mean - other_mean,
                          torch.full_like(gold_mean, float("nan")))
        for head in range(query.shape[0]):
            records.append((layer, head, "replay_gold_share", float(share[head])))
            records.append((layer, head, "replay_gold_logit_gap", float(gap[head])))
    return pd.DataFrame(records, columns=["layer", "head", "metric", "value"])


@dataclass
class ProbedCondition:
    """One condition's generation plus its readouts at the final question token and the teacher-forced token."""

    condition: str
    generation: object  # relaylens.generation.rows.GenerationResult
    readouts: pd.DataFrame  # columns: probe_point, layer, head, metric, value
    question_recorder: FinalTokenRecorder


def probe_condition(model, prefill: PrefillResult, selection: Selection, condition: str | Condition,
                    question_ids: torch.Tensor, evidence_mask: torch.Tensor, factors: RotaryFactors | None = None,
                    teacher_token: int | None = None, grad: bool = False, next_answer_token: int | None = None,
                    **generation_kwargs) -> ProbedCondition:
    """Run one condition (question pass, optional teacher-forced first answer token, greedy decoding) with probes.

    ``generation_kwargs`` go to :func:`relaylens.generation.single.run_condition` (``max_new_tokens``, ``tokenizer``,
    ...). ``grad=True`` runs the question pass with autograd and adds the attribution readouts of
    :mod:`relaylens.probes.attribution` towards ``teacher_token`` (the correct first answer token, required) at the
    final question token, and towards ``next_answer_token`` (the answer's next token, if given) at the teacher-forced
    token. Several conditions of one prefill: :func:`probe_rows` decodes them in one batch (``grad=True`` too).
    """
    from relaylens.generation.single import run_condition  # noqa: PLC0415 - import cost: transformers loads on first use

    _check_grad(grad, teacher_token)
    factors = factors or RotaryFactors.from_model(model)
    gold = gold_slots(selection, evidence_mask)
    question_recorder, teacher_recorder = FinalTokenRecorder(), FinalTokenRecorder()
    with final_residuals(model) if grad else contextlib.nullcontext([]) as residuals:
        generation = run_condition(model, prefill, selection, condition, question_ids, factors=factors,
                                   observers=[question_recorder], teacher_token=teacher_token,
                                   teacher_observers=[teacher_recorder], grad=grad, **generation_kwargs)
    groups = prefill.num_key_value_groups
    frames = [readouts(question_recorder, selection, gold, groups).assign(probe_point="question_final")]
    if teacher_token is not None:
        frames.append(readouts(teacher_recorder, selection, gold, groups).assign(probe_point="first_answer_token"))
    if grad:
        frames.extend(_attribution_frames(model, generation, (question_recorder, teacher_recorder), residuals,
                                          selection, gold, groups, teacher_token, next_answer_token))
    return ProbedCondition(generation.condition, generation, pd.concat(frames, ignore_index=True), question_recorder)


def _check_grad(grad: bool, teacher_token: int | None) -> None:
    if grad and teacher_token is None:
        raise RelaylensError("probe_condition(grad=True) attributes the correct first answer token's log-probability; "
                             "pass teacher_token=<its id> (records without a reference answer have none)")


def _attribution_frames(model, generation, recorders: tuple, residuals: list, selection: Selection,
                        gold: torch.Tensor, groups: int, teacher_token: int, next_answer_token: int | None) -> list:
    """The attribution readouts of one autograd question pass (gradient x input, then direct logit attribution, at
    ``question_final`` and, given ``next_answer_token``, at ``first_answer_token``); frees the pass's graph."""

    question_recorder, teacher_recorder = recorders
    points = [("question_final", question_recorder, generation.question_logits[-1], teacher_token, residuals[0])]
    if next_answer_token is not None:
        points.append(("first_answer_token", teacher_recorder, generation.teacher_logits, next_answer_token,
                       residuals[1]))
    frames = []
    for point, recorder, logits, target, residual in points:
        objective = target_log_prob(logits, target)
        frames.append(grad_x_input(objective, generation.head_inputs, question_recorder.widths, selection, gold,
                                   groups).assign(probe_point=point))
        frames.append(logit_attribution(model, recorder, selection, gold, groups, target,
                                        residual).assign(probe_point=point))
    generation.question_logits = generation.question_logits.detach()  # free the graph
    generation.teacher_logits = generation.head_inputs = generation.inputs = None
    return frames


def replay_conditions(reference: ProbedCondition, prefill: PrefillResult, selection: Selection,
                      evidence_mask: torch.Tensor,
                      conditions: list[str], num_question_tokens: int, factors: RotaryFactors) -> pd.DataFrame:
    """Phase replay of ``conditions`` with content from the ``reference`` pass (normally ``original``)."""
    gold = gold_slots(selection, evidence_mask)
    position = reference.generation.question_start + num_question_tokens - 1
    content = replay_content(reference.question_recorder, position, prefill, selection, factors)
    frames = []
    for condition in conditions:
        label = get_condition(condition).label
        frames.append(phase_replay(content, selection, gold, condition, num_question_tokens,
                                   factors).assign(condition=label))
    if not frames:  # e.g. relay@layer_type=* on a model with one layer type expands to no condition
        return pd.DataFrame(columns=["layer", "head", "metric", "value", "condition", "probe_point"])
    return pd.concat(frames, ignore_index=True).assign(probe_point="question_final")


@dataclass(frozen=True)
class ReplayProbe:
    """The probe kind ``replay`` (:mod:`relaylens.probes.registry`): phase replay of ``spec.replay_conditions`` with
    content from the unit's ``original`` forward pass; probe rows with ``source = "replay"``."""

    name: str = "replay"

    def enabled(self, spec, config) -> bool:
        return bool(spec.probes) and bool(spec.replay_conditions)

    def run(self, unit: UnitContext) -> ProbeTables:
        reference = unit.probed.get("original")
        if not unit.probing or reference is None:  # no forward pass to take the content from
            return ProbeTables()
        conditions = expand_conditions(unit.spec.replay_conditions, unit.model)
        frame = replay_conditions(reference, unit.prefill, unit.selection, unit.evidence, conditions,
                                  int(unit.prompt.question_ids.numel()), unit.factors)
        return ProbeTables(probes=(frame.assign(source="replay"),))


REPLAY = ReplayProbe()


def probe_rows(model, prefill: PrefillResult, rows: list[tuple[Selection, str | Condition]], question_ids: torch.Tensor,
               evidence_mask: torch.Tensor, factors: RotaryFactors | None = None, teacher_token: int | None = None,
               grad: bool = False, next_answer_token: int | None = None, **generation_kwargs) -> list[ProbedCondition]:
    """:func:`probe_condition` for many ``(selection, condition)`` rows of one prefill, decoded in one batch.

    Every row gets the readouts a sequential :func:`probe_condition` call gives (its observers see the row alone);
    ``generation_kwargs`` go to :func:`relaylens.generation.rows.run_rows`. ``grad=True`` (attribution, as in
    :func:`probe_condition`): the rows decode in one batch without autograd, and each row's question pass and
    teacher-forced token run once more on their own with autograd (no decoding under autograd), which give its
    readouts and attribution rows exactly as the one-row path computes them.
    """
    from relaylens.generation.rows import Row, run_rows  # noqa: PLC0415 - import cost: transformers loads on first use

    factors = factors or RotaryFactors.from_model(model)
    if grad:
        _check_grad(grad, teacher_token)
        decoded = run_rows(model, prefill, [Row(selection, condition) for selection, condition in rows], question_ids,
                           factors=factors, **generation_kwargs)  # decoding only, as run_condition(grad=True) decodes
        window_mode = generation_kwargs.get("window_mode", "condition")
        return [_attributed_row(model, prefill, selection, condition, question_ids, evidence_mask, factors,
                                teacher_token, next_answer_token, generation, window_mode)
                for (selection, condition), generation in zip(rows, decoded)]
    recorders = [(FinalTokenRecorder(), FinalTokenRecorder()) for _ in rows]
    batch = [Row(selection, condition, (question,), (teacher,)) for (selection, condition),
             (question, teacher) in zip(rows, recorders)]
    generations = run_rows(model, prefill, batch, question_ids, factors=factors, teacher_token=teacher_token,
                           **generation_kwargs)
    groups, probed = prefill.num_key_value_groups, []
    for (selection, _), (question, teacher), generation in zip(rows, recorders, generations):
        gold = gold_slots(selection, evidence_mask)
        frames = [readouts(question, selection, gold, groups).assign(probe_point="question_final")]
        if teacher_token is not None:
            frames.append(readouts(teacher, selection, gold, groups).assign(probe_point="first_answer_token"))
        probed.append(ProbedCondition(generation.condition, generation, pd.concat(frames, ignore_index=True), question))
    return probed


def _attributed_row(model, prefill: PrefillResult, selection: Selection, condition, question_ids: torch.Tensor,
                    evidence_mask: torch.Tensor, factors: RotaryFactors, teacher_token: int,
                    next_answer_token: int | None, decoded, window_mode: str) -> ProbedCondition:
    """One row of :func:`probe_rows` with ``grad=True``: the autograd question pass and teacher-forced token of
    :func:`probe_condition` (``max_new_tokens=0``), carrying the answer ``decoded`` in the batch."""
    probed = probe_condition(model, prefill, selection, condition, question_ids, evidence_mask, factors=factors,
                             teacher_token=teacher_token, grad=True, next_answer_token=next_answer_token,
                             max_new_tokens=0, window_mode=window_mode)
    generation = probed.generation
    generation.token_ids, generation.positions = decoded.token_ids, decoded.positions
    generation.stop_reason, generation.text = decoded.stop_reason, decoded.text
    return probed
