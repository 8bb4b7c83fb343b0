"""Protected spans: instruction and chat-template tokens that every selector keeps, outside the budget.

The rule (the paper's summarization setting, ``--protect-instructions``): history tokens outside every *source unit*
(the session spans of :class:`~relaylens.datasets.spans.RenderedPrompt`: the document of a summarization item, the
sessions of a memory record) are *protected*: the task instruction, the chat template's head, and the separators between
units (:meth:`RenderedPrompt.protected_mask`). The budget ratio applies to the ``n_src = L - P`` source tokens only:
``K_src = floor(ratio * n_src)`` (an absolute budget ``B`` gives ``min(B, n_src)``), and every head keeps all ``P``
protected states on top.

One implementation wraps any selector (:func:`select_protected`), so all registered selectors follow the same rule:

1. ask the selector for ``K_src + P`` states (capped at ``L``) over the whole history — it scores exactly as it
   would without protection;
2. per (layer, kv head) keep every protected position, and of the source positions the selector kept, the
   ``m - P`` with the highest selection scores (ties: the later position), ``m`` being what that head kept.

For a top-k selector this is exactly "force-keep the protected states and choose the selector's top ``K_src``
source states": its top ``K_src + P`` always holds at least ``K_src`` source states, and their best ``K_src`` are
its best source states overall. Per-head allocations (PyramidKV, Ada-KV) keep their shape, shifted by ``P``; a head
allotted fewer than ``P`` states keeps only the protected ones. Selectors that never keep a token outside the source
units (BM25 without ``keep_prefix``) say so (:meth:`~relaylens.selectors.base.Selector.protected_request`) and are
asked for ``K_src`` directly, untrimmed. Merged values (CaM) follow their states; a protected state the selector did
not keep carries its own value. Protected states are ordinary retained states for the coordinate conditions
(RoPERelay compacts them with the rest).

The ``framing`` analysis asks which part of the framing matters: :func:`framing_mask` builds the kept set of each
cell of :data:`FRAMING_CELLS`, and every cell gets the same source budget (``source_length``: the tokens inside the
sessions), so cells differ only in what is kept on top of it.

Example:
    >>> import torch
    >>> from relaylens.selectors import make_selector
    >>> from relaylens.selectors.synthetic import random_prefill
    >>> protected = torch.zeros(96, dtype=torch.bool); protected[:16] = True  # a 16-token instruction
    >>> sel = select_protected(make_selector("snapkv", window=8), random_prefill(length=96), None, 0.25, protected)
    >>> sel.counts.tolist(), sel.info["source_budget"]  # 16 protected + floor(0.25 * 80) source states per head
    ([[36, 36], [36, 36]], 20)
    >>> bool((sel.positions[..., :16] == torch.arange(16)).all())
    True
"""

from __future__ import annotations

import torch

from relaylens.errors import ShapeError
from relaylens.geometry.selection import Selection
from relaylens.selectors.base import Budget, top_positions

__all__ = ["select_protected", "source_budget", "framing_mask", "FRAMING_CELLS"]

FRAMING_CELLS = ("none", "sink1", "sink4", "instruction", "template", "headers", "framing", "all")
"""What a ``framing`` cell keeps on top of the budget (parts: :meth:`RenderedPrompt.framing_parts`):

* ``none``: nothing (the framing competes for the budget: the *framing evicted* regime at the same source budget);
* ``sink1`` / ``sink4``: the first 1 / 4 history tokens only (the attention sink);
* ``instruction``: the task instruction (and ``History Chats:``); ``template``: the chat template's head;
* ``headers``: the session headers and dates;
* ``framing``: everything outside the sessions (instruction, template, separators): the default protected set;
* ``all``: ``framing`` and the session headers.
"""


def source_budget(budget, source_length: int) -> int:
    """``K_src``: the budget applied to the source tokens only (a ratio of ``source_length``, or states capped at it).

    >>> source_budget(0.1, 905), source_budget(2048, 905), source_budget("B64", 905)
    (90, 905, 64)
    """
    return Budget.coerce(budget).tokens(source_length)


def framing_mask(prompt, cell: str) -> torch.Tensor:
    """``[L]`` bool: the history tokens framing ``cell`` (:data:`FRAMING_CELLS`) keeps on top of the budget.

    >>> from relaylens.datasets import bundled_sample_path, load_records
    >>> from relaylens.datasets.prompting import render_prompt
    >>> from relaylens.testing import tiny_tokenizer
    >>> p = render_prompt(load_records(bundled_sample_path())[0], tiny_tokenizer(), mode="completion")
    >>> ([int(framing_mask(p, c).sum()) for c in ("none", "sink4")],
    ...  bool((framing_mask(p, "framing") == p.protected_mask()).all()))
    ([0, 4], True)
    """
    length = prompt.history_length
    if cell not in FRAMING_CELLS:
        raise ShapeError(f"framing cell {cell!r} is not one of {FRAMING_CELLS}")
    mask = torch.zeros(length, dtype=torch.bool)
    if cell in ("sink1", "sink4"):
        mask[: int(cell[-1])] = True
        return mask
    if cell == "none":
        return mask
    parts = prompt.framing_parts()
    if cell in ("instruction", "template", "headers"):
        return parts[cell]
    framing = parts["template"] | parts["instruction"] | parts["separators"]
    return framing | parts["headers"] if cell == "all" else framing


def select_protected(selector, prefill, prompt, budget, protected: torch.Tensor | None = None,
                     source_length: int | None = None) -> Selection:
    """``selector``'s selection with the protected states kept and the budget applied to the source tokens.

    Args:
        selector: any registered selector (prepared for the record, as the runner passes it).
        prefill: the record's :class:`~relaylens.model.prefill.PrefillResult`.
        prompt: the rendered prompt (its :meth:`protected_mask` is used when ``protected`` is None).
        budget: ratio or states, as for :meth:`Selector.select`, applied to the source tokens.
        protected: ``[L]`` bool, True at protected history positions (default: ``prompt.protected_mask()``).
        source_length: the token count the budget ratio applies to (default: the unprotected tokens, ``L - P``);
            the ``framing`` analysis fixes it to the session tokens so that every cell has the same source budget.
    """
    length = prefill.history_length
    if protected is None:
        if prompt is None:
            raise ShapeError("protected spans need the rendered prompt (its unit spans) or an explicit protected mask")
        protected = prompt.protected_mask()
    protected = torch.as_tensor(protected, dtype=torch.bool).cpu()  # [L]
    if protected.shape != (length,):
        raise ShapeError(f"protected mask has shape {tuple(protected.shape)}; the history has {length} tokens")
    n_protected = int(protected.sum())
    if n_protected == 0 and source_length is None:
        return selector.select(prefill, prompt, budget)
    n_source = length - n_protected if source_length is None else int(source_length)
    if n_source <= 0 or n_protected >= length:
        raise ShapeError(f"record {getattr(prompt, 'record_id', '?')}: every one of the {length} history tokens is "
                         "protected; there is no source text to select from")
    k_source = source_budget(budget, n_source)
    if n_protected == 0:
        return selector.select(prefill, prompt, Budget(states=k_source))
    request = min(length, selector.protected_request(k_source, n_protected))
    raw = selector.select(prefill, prompt, Budget(states=request))
    extra = max(request - k_source, 0)  # states asked for beyond the source budget, given back to the protected ones
    keep, scores, values = _rebuild(raw, prefill, protected, extra)
    info = dict(raw.info) | {"protected": n_protected, "source_length": n_source, "source_budget": k_source,
                             "requested": request}
    return Selection.from_lists(keep, length, scores=scores, values=values, info=info)


def _rebuild(raw: Selection, prefill, protected: torch.Tensor, extra: int):
    """Per (layer, kv head): all protected positions plus the best ``m - extra`` kept source positions."""
    always = torch.nonzero(protected).flatten()  # [P] sorted
    keep, scores, values = [], [], [] if raw.values is not None else None
    for l in range(raw.num_layers):
        layer_keep, layer_scores, layer_values = [], [], []
        for h in range(raw.num_kv_heads):
            valid = raw.valid[l, h]
            pos = raw.positions[l, h][valid]  # [m] sorted
            score = raw.scores[l, h][valid] if raw.scores is not None else (pos + 1).float()  # [m]
            source = ~protected[pos]  # [m]
            target = max(int(valid.sum()) - extra, 0)
            src_pos, src_score = pos[source], score[source]
            if src_pos.numel() > target:
                chosen = top_positions(src_score, target)  # indices into src_pos, ascending
                src_pos, src_score = src_pos[chosen], src_score[chosen]
            merged = torch.cat([always, src_pos])  # [P + target]
            order = torch.argsort(merged)
            top = float(src_score.max()) + 1.0 if src_score.numel() else 1.0
            merged_score = torch.cat([torch.full((always.numel(),), top), src_score.float()])
            layer_keep.append(merged[order])
            layer_scores.append(merged_score[order])
            if values is not None:
                by_pos = dict(zip(pos.tolist(), raw.values[l, h][valid]))  # position -> merged value [d]
                own = prefill.values[l][h].cpu()  # [L, d]
                vals = [by_pos[p] if p in by_pos else own[p].to(raw.values.dtype) for p in merged[order].tolist()]
                layer_values.append(torch.stack(vals))  # [P + target, d]
        keep.append(layer_keep)
        scores.append(layer_scores)
        if values is not None:
            values.append(layer_values)
    return keep, scores, values
