"""Evidence attribution to the answer: gradient x input and direct logit attribution, per layer and query head.

Axes: ``layer``, ``q_head``, ``slot``, ``head_dim``, ``hidden`` (:mod:`relaylens.geometry`). The *target* of a probe
point is the reference-answer token it predicts: the first answer token at ``question_final``, the next answer token at
``first_answer_token`` (teacher-forced).

Readouts (``i`` runs over the retained states of the query head's kv head; ``gold``: those inside gold evidence):

* ``evidence_grad_x_input`` = ``sum_gold (dlogp/dk_i . k_i + dlogp/dv_i . v_i)``: gradient x input of the target's
  log-probability w.r.t. the retained keys and values as that query head reads them (autograd over every pass that
  reads them: the question pass, and the teacher-forced token for its target). Summed over the heads of a kv group it
  is the gradient x input w.r.t. the shared cached state. ``history_grad_x_input``: the same over all retained states;
  ``evidence_grad_x_input_share`` = ``sum_gold |gxi_i| / sum_i |gxi_i|`` (magnitudes: signed sums can cancel).
* ``evidence_logit_contribution`` = ``u_t . (g * s * W_O[:, head] sum_gold a_i v_i)``: the head's evidence read-out
  pushed through its slice of ``o_proj`` and the final RMSNorm with its scale ``s = 1/rms`` frozen at the run's
  value (``g``: the norm's gain) onto the unembedding row ``u_t`` of the target (direct path only; logits before any
  soft-capping). ``history_logit_contribution``: the same with every retained state.

Example:
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> gain, eps = rms_norm_gain(final_norm(tiny_model("llama")))
    >>> gain.shape, bool((gain == 1).all())
    (torch.Size([64]), True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pandas as pd
import torch

from relaylens.model.hf import final_norm, output_projection, rms_norm_gain  # norms keep this old home

GRAD_READOUTS = ("evidence_grad_x_input", "history_grad_x_input", "evidence_grad_x_input_share")
LOGIT_READOUTS = ("evidence_logit_contribution", "history_logit_contribution")
ATTRIBUTION_READOUTS = GRAD_READOUTS + LOGIT_READOUTS


@contextlib.contextmanager
def final_residuals(model) -> Iterator[list[torch.Tensor]]:
    """``with final_residuals(model) as rows:`` appends, per forward, the last position's input to the final norm
    (``[hidden]`` float32, detached): the residual stream the logits are read from."""
    rows: list[torch.Tensor] = []

    def hook(module, args):
        rows.append(args[0][0, -1].detach().float().clone())

    handle = final_norm(model).register_forward_pre_hook(hook)
    try:
        yield rows
    finally:
        handle.remove()


def logit_direction(model, target: int, residual: torch.Tensor) -> torch.Tensor:
    """``[hidden]`` ``g * s * u_t``: a residual-stream write ``c`` moves the target logit by ``direction . c`` with the
    final norm's scale ``s`` frozen at its value on ``residual``."""
    gain, eps = rms_norm_gain(final_norm(model))
    scale = torch.rsqrt(residual.float().pow(2).mean() + eps)
    unembed = model.get_output_embeddings().weight[int(target)].detach().float()  # [hidden]
    return unembed.to(gain.device) * gain * scale


def logit_attribution(model, recorder, selection, gold: torch.Tensor, groups: int, target: int,
                      residual: torch.Tensor) -> pd.DataFrame:
    """Direct logit attribution per (layer, q_head) from a :class:`~relaylens.probes.readouts.FinalTokenRecorder`."""
    direction = logit_direction(model, target, residual)  # [hidden]
    records = []
    for layer in sorted(recorder.rows):
        width = recorder.widths[layer]
        row = recorder.rows[layer][:, :width]  # [q_head, slot]
        q_heads = row.shape[0]
        kv_of = torch.arange(q_heads) // groups
        valid = selection.valid[layer, :, :width][kv_of]  # [q_head, slot]
        is_gold = gold[layer, :, :width][kv_of] & valid
        values = recorder.values[layer][kv_of]  # [q_head, slot, head_dim]
        weight = output_projection(model, layer)  # [hidden, q_head * head_dim]
        head_dir = (direction.to(weight.device) @ weight).reshape(q_heads, -1).cpu()  # [q_head, head_dim]
        per_state = torch.einsum("hsd,hd->hs", values, head_dir) * row  # [q_head, slot]: a_i u.(W_O v_i)
        gold_sum, total = (per_state * is_gold).sum(-1), (per_state * valid).sum(-1)
        for head in range(q_heads):
            records.append((layer, head, "evidence_logit_contribution", float(gold_sum[head])))
            records.append((layer, head, "history_logit_contribution", float(total[head])))
    return pd.DataFrame(records, columns=["layer", "head", "metric", "value"])


def target_log_prob(logits: torch.Tensor, target: int) -> torch.Tensor:
    """Scalar log-probability of ``target`` under ``logits`` ``[vocab]`` (keeps the graph)."""
    return torch.log_softmax(logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32),
                             -1)[int(target)]


def grad_x_input(objective: torch.Tensor, head_inputs: dict, widths: dict[int, int], selection,
                 gold: torch.Tensor, groups: int) -> pd.DataFrame:
    """Gradient x input of ``objective`` per (layer, q_head) over gold / all retained states.

    ``head_inputs``: ``layer -> [(key, value)]`` per-query-head views ``[1, q_head, key, head_dim]`` from the
    differentiable path (history slots first, ``widths[layer]`` of them); gradients of every pass are summed.
    """
    layers = sorted(head_inputs)
    flat = [t for layer in layers for pair in head_inputs[layer] for t in pair]
    grads = torch.autograd.grad(objective, flat, retain_graph=True, allow_unused=True)
    records, at = [], 0
    for layer in layers:
        width = widths[layer]
        total = None
        for key, value in head_inputs[layer]:
            g_key, g_value = grads[at], grads[at + 1]
            at += 2
            part = 0.0
            if g_key is not None:
                part = part + (g_key[0, :, :width] * key[0, :, :width]).sum(-1)
            if g_value is not None:
                part = part + (g_value[0, :, :width] * value[0, :, :width]).sum(-1)
            total = part if total is None else total + part
        per_state = torch.as_tensor(total).detach().double().cpu()  # [q_head, slot]
        q_heads = head_inputs[layer][0][0].shape[1]
        if per_state.dim() == 0:
            per_state = torch.zeros(q_heads, width, dtype=torch.float64)
        kv_of = torch.arange(q_heads) // groups
        valid = selection.valid[layer, :, :width][kv_of]
        is_gold = gold[layer, :, :width][kv_of] & valid
        magnitude = per_state.abs()
        denominator = (magnitude * valid).sum(-1)
        metrics = {
            "evidence_grad_x_input": (per_state * is_gold).sum(-1),
            "history_grad_x_input": (per_state * valid).sum(-1),
            "evidence_grad_x_input_share": torch.where(denominator > 0, (magnitude * is_gold).sum(-1) / denominator,
                                                       torch.full_like(denominator, float("nan"))),
        }
        for name, per_head in metrics.items():
            for head, v in enumerate(per_head.tolist()):
                records.append((layer, head, name, v))
    return pd.DataFrame(records, columns=["layer", "head", "metric", "value"])
