"""One record under one condition, for interpretability tools: a TransformerLens ``ActivationCache`` of the question
pass over the relocated cache, and a CircuitsVis-ready export of the final question token's attention over the kept,
relocated history.

Axes: ``layer``, ``kv_head``, ``q_head``, ``slot``, ``key`` (:mod:`relaylens.geometry`); ``Q`` question tokens.

:func:`record_activations` renders a record, prefills its history, runs a selector and calls
:func:`relay_activations`, which relocates the kept keys to the condition's coordinates
(:func:`relaylens.generation.cache.build_cache`) and runs the question at the condition's positions through a
TransformerLens ``TransformerBridge`` with ``run_with_cache`` (the probes' TransformerLens backend,
:func:`relaylens.probes.transformer_lens.question_pass_with_cache`). In the returned :class:`RelayActivations`,
``cache`` is TransformerLens's own ``ActivationCache``: ``cache["blocks.3.attn.hook_pattern"]`` is ``[1, q_head, Q,
key]`` with the layer's history slots first (``widths[layer]`` of them, padded slots at zero weight) and the question
tokens after them; ``cache["blocks.3.attn.hook_rot_q"]`` holds the queries rotated at the condition's positions.

:meth:`RelayActivations.attention_export` turns the final question token's row of one (layer, kv head) into an
:class:`AttentionExport`: one slot per kept state, in the order of the new positions, labelled ``token source ->
new`` (``★`` marks gold evidence), the attention of each query head of the kv head's group, and the weight the token
gives to the question itself. ``to_dict()`` is JSON; ``attention_heads()`` (CircuitsVis's current attention view,
which supersedes ``attention_patterns``), ``colored_tokens()``, ``colored_tokens_multi()`` and ``attention_pattern()``
(one head) return the keyword arguments of the CircuitsVis functions of those names
(``circuitsvis.tokens.colored_tokens(**view.colored_tokens())``; CircuitsVis is the optional ``interp`` extra).
Nothing is loaded from the network.

Example (a tiny random Llama; two kv heads keeping 4 and 3 states):
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> from relaylens.model.prefill import prefill_history
    >>> from relaylens.geometry.selection import Selection
    >>> model = tiny_model("llama")
    >>> prefill = prefill_history(model, torch.arange(3, 43), window_size=8)
    >>> selection = Selection.from_lists([[[2, 5, 19, 39], [0, 9, 39]]] * 2, prefill.history_length)
    >>> evidence = torch.zeros(40, dtype=torch.bool)
    >>> evidence[5] = True
    >>> run = relay_activations(model, prefill, selection, "relay", torch.tensor([50, 51, 52]), evidence)
    >>> run.cache["blocks.0.attn.hook_pattern"].shape  # [batch, q_head, query, key]: 4 history slots, 3 question
    torch.Size([1, 4, 3, 7])
    >>> view = run.attention_export(layer=1, kv_head=1)
    >>> view.labels, view.question_label
    (['3 0 -> 1', '12 9 -> 2', '42 39 -> 3'], "final question token '52' @ 6")
    >>> run.attention_export(layer=1, kv_head=0).labels[1]
    '8 5 -> 1 ★'
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from relaylens.conditions.catalogue import Condition, Coordinates
from relaylens.datasets.prompting import render_prompt
from relaylens.errors import RelaylensError
from relaylens.generation.cache import build_cache
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.integrations.hf_generate import generation_condition, require_rotary, select_history
from relaylens.integrations.learned_use import check_learned_use
from relaylens.model.prefill import PrefillResult
from relaylens.probes.readouts import gold_slots
from relaylens.probes.transformer_lens import bridge_model, question_pass_with_cache
from relaylens.selectors import make_selector
from relaylens.selectors.arguments import parse_selector_arg

__all__ = ["AttentionExport", "RelayActivations", "record_activations", "relay_activations"]

EVIDENCE_MARK = "★"


@dataclass
class AttentionExport:
    """The final question token's attention over the kept, relocated history of one (layer, kv head).

    Slots are ordered by their new position. ``attention[r][i]`` is query head ``q_heads[r]``'s weight on slot ``i``;
    ``question_share[r]`` its weight on the question tokens (each row of ``attention`` plus its question share sums to
    1). ``labels[i]`` is ``"token source -> new"`` with ``" ★"`` appended on gold evidence (line breaks escaped, a
    blank token quoted); ``tokens`` keeps the decoded text as is.
    """

    condition: str
    layer: int
    kv_head: int
    q_heads: list[int]
    tokens: list[str]
    source_positions: list[int]
    new_positions: list[int | float]
    evidence: list[bool]
    attention: list[list[float]]  # [group, slot]
    question_share: list[float]  # [group]
    question_label: str
    question_position: int | float
    labels: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.labels = [f"{_visible(token)} {source} -> {new}" + (f" {EVIDENCE_MARK}" if gold else "")
                       for token, source, new, gold in zip(self.tokens, self.source_positions, self.new_positions,
                                                           self.evidence)]

    def to_dict(self) -> dict:
        """Every field, JSON-ready (``json.dumps(view.to_dict())``)."""
        return {name: getattr(self, name) for name in ("condition", "layer", "kv_head", "q_heads", "labels", "tokens",
                                                       "source_positions", "new_positions", "evidence", "attention",
                                                       "question_share", "question_label", "question_position")}

    def to_json(self, path=None) -> str:
        """:meth:`to_dict` as JSON text; also written to ``path`` when given."""
        text = json.dumps(self.to_dict())
        if path is not None:
            Path(path).write_text(text)
        return text

    def weights(self, head: int | None = None) -> list[float]:
        """The attention on each slot: one query head's (``head``, one of ``q_heads``) or the mean over them."""
        if head is None:
            return [sum(column) / len(column) for column in zip(*self.attention)]
        if head not in self.q_heads:
            raise RelaylensError(f"query head {head} does not read kv head {self.kv_head} (its query heads are "
                                 f"{self.q_heads}); pass one of those, or None for their mean")
        return list(self.attention[self.q_heads.index(head)])

    def _square(self, row: list[float], share: float) -> list[list[float]]:
        n = len(row)
        square = [[0.0] * (n + 1) for _ in range(n)]  # only the final question token's row was recorded
        return square + [row + [share]]

    def colored_tokens(self, head: int | None = None) -> dict:
        """Keyword arguments of ``circuitsvis.tokens.colored_tokens``: the slots coloured by attention (one query
        head, or the mean over the kv head's group)."""
        return {"tokens": list(self.labels), "values": self.weights(head)}

    def colored_tokens_multi(self) -> dict:
        """Keyword arguments of ``circuitsvis.tokens.colored_tokens_multi``: one value column per query head."""
        return {"tokens": list(self.labels), "values": torch.tensor(self.attention).T.contiguous(),
                "labels": [f"L{self.layer}H{h}" for h in self.q_heads]}

    def attention_heads(self, head: int | None = None) -> dict:
        """Keyword arguments of ``circuitsvis.attention.attention_heads`` (CircuitsVis's current attention view; it
        supersedes ``attention_patterns``): per query head of the group (or only ``head``), a square over the slots
        and the final question token, whose last row is that token's attention (the other rows are not recorded:
        zero) and whose last column is its weight on the question."""
        heads = self.q_heads if head is None else [head]
        if head is not None:
            self.weights(head)  # refuses a query head outside the group, naming the group
        return {"tokens": self.labels + [self.question_label],
                "attention": [self._square(self.weights(h), self.question_share[self.q_heads.index(h)])
                              for h in heads],
                "attention_head_names": [f"L{self.layer}H{h}" for h in heads], "mask_upper_tri": False}

    def attention_pattern(self, head: int | None = None) -> dict:
        """Keyword arguments of ``circuitsvis.attention.attention_pattern`` (one pattern, still rendered by CircuitsVis
        1.43): :meth:`attention_heads`' square of one query head, or of the mean over the group."""
        share = (sum(self.question_share) / len(self.question_share) if head is None
                 else self.question_share[self.q_heads.index(head)])
        return {"tokens": self.labels + [self.question_label], "attention": self._square(self.weights(head), share),
                "mask_upper_tri": False}


@dataclass
class RelayActivations:
    """The question pass of one record under one condition, as TransformerLens sees it.

    Attributes:
        condition: the condition's name.
        cache: TransformerLens's ``ActivationCache`` of the question pass (see the module docstring for key axes).
        logits: ``[Q, vocab]`` float32 logits of the question tokens.
        question_ids: ``[Q]``; question_positions: ``[Q]`` the positions the question ran at.
        selection: the kept states; coordinates: the condition's key positions per (layer, kv head, slot).
        evidence: ``[layer, kv_head, slot]`` bool, kept states inside gold evidence (all False without a mask).
        history_tokens: each history token as text (token ids as text without a tokenizer).
        widths: per layer, the history slots in the cache (the key axis of attention hooks starts with them).
        groups: query heads per kv head.
    """

    condition: str
    cache: object
    logits: torch.Tensor
    question_ids: torch.Tensor
    question_positions: torch.Tensor
    selection: Selection
    coordinates: Coordinates
    evidence: torch.Tensor
    history_tokens: list[str]
    question_tokens: list[str]
    widths: list[int]
    groups: int

    def final_attention(self, layer: int) -> torch.Tensor:
        """``[q_head, key]`` the final question token's attention in ``layer`` (history slots, then the question)."""
        name = f"blocks.{layer}.attn.hook_pattern"
        if name not in self.cache.keys():
            raise RelaylensError(f"the activation cache holds no {name}: the run's names_filter left it out; include "
                                 "the attention pattern hooks (e.g. names_filter=lambda n: n.endswith('hook_pattern'))")
        return self.cache[name][0, :, -1].float()

    def attention_export(self, layer: int, kv_head: int = 0) -> AttentionExport:
        """The final question token's attention over the kept, relocated history of one (layer, kv head)."""
        if not 0 <= layer < self.selection.num_layers or not 0 <= kv_head < self.selection.num_kv_heads:
            raise RelaylensError(f"layer {layer}, kv head {kv_head} is outside the model ({self.selection.num_layers} "
                                 f"layers, {self.selection.num_kv_heads} kv heads); pick one inside")
        row = self.final_attention(layer)  # [q_head, width + Q]
        width = self.widths[layer]
        m = int(self.selection.counts[layer, kv_head])
        heads = list(range(kv_head * self.groups, (kv_head + 1) * self.groups))
        source = self.selection.positions[layer, kv_head, :m]
        new = self.coordinates.key_positions[layer, kv_head, :m]
        order = torch.argsort(new.double(), stable=True)  # slots in the order of their new position
        attention = row[heads][:, :m][:, order]  # [group, m]
        new_list = [int(v) if not new.is_floating_point() else float(v) for v in new[order].detach()]
        q_position = self.question_positions[-1].item()
        return AttentionExport(
            condition=self.condition, layer=layer, kv_head=kv_head, q_heads=heads,
            tokens=[self.history_tokens[int(p)] for p in source[order]],
            source_positions=[int(p) for p in source[order]], new_positions=new_list,
            evidence=[bool(g) for g in self.evidence[layer, kv_head, :m][order]],
            attention=[[round(float(v), 6) for v in head_row] for head_row in attention],
            question_share=[round(float(v), 6) for v in row[heads][:, width:].sum(-1)],
            question_label=f"final question token {self.question_tokens[-1]!r} @ {q_position}",
            question_position=q_position,
        )


def relay_activations(model_or_bridge, prefill: PrefillResult, selection: Selection, condition: str | Condition,
                      question_ids: torch.Tensor, evidence_mask: torch.Tensor | None = None, tokenizer=None,
                      names_filter=None, factors: RotaryFactors | None = None,
                      window_mode: str = "condition") -> RelayActivations:
    """Run the question under ``condition`` through TransformerLens with ``run_with_cache``.

    Args:
        model_or_bridge: a ``TransformerBridge`` booted by :func:`relaylens.probes.transformer_lens.bridge_model`
            (boot once, reuse), or a Hugging Face model (wrapped on a copy for this call).
        prefill, selection: the history's prefill and the kept states (one selection, any condition).
        question_ids: ``[Q]`` everything after the history.
        evidence_mask: ``[L]`` bool gold-evidence tokens (``prompt.evidence_mask("turn")``), or None.
        tokenizer: decodes the tokens of the export's labels (ids as text without one).
        names_filter: TransformerLens's ``run_with_cache`` filter (default: every hook).

    Raises:
        RelaylensError: an empty question or a mask of the wrong length, before any model work.
    """
    question_ids = torch.as_tensor(question_ids, dtype=torch.long).reshape(-1)
    if question_ids.numel() == 0:
        raise RelaylensError("the question has no tokens; render the prompt with a question block")
    evidence = torch.zeros_like(selection.valid)  # a record without gold evidence exports unmarked slots
    if evidence_mask is not None:
        evidence_mask = torch.as_tensor(evidence_mask, dtype=torch.bool).reshape(-1)
        if evidence_mask.numel() != selection.history_length or bool(evidence_mask.any()):
            evidence = gold_slots(selection, evidence_mask)  # refuses a mask of the wrong length, naming both
    bridge = model_or_bridge if _is_bridge(model_or_bridge) else bridge_model(model_or_bridge, tokenizer)
    factors = factors or getattr(bridge, "relaylens_factors", None)
    if factors is None:
        raise RelaylensError("pass factors=RotaryFactors.from_model(hf_model) for a bridge not booted by "
                             "bridge_model()")
    relocated = build_cache(prefill, selection, condition, factors, window_mode)
    coords = relocated.coordinates
    positions = coords.question_positions(question_ids.numel())
    factors.check_positions(positions[-1:] + 1, f"condition {coords.condition}: question positions")
    source = torch.arange(question_ids.numel()) + prefill.history_length
    logits, cache, _ = question_pass_with_cache(bridge, relocated, question_ids, positions, source,
                                                prefill.num_key_value_groups, names_filter=names_filter)
    return RelayActivations(coords.condition, cache, logits, question_ids, positions, selection, coords, evidence,
                            _token_texts(tokenizer, prefill.history_ids), _token_texts(tokenizer, question_ids),
                            list(relocated.widths), prefill.num_key_value_groups)


def record_activations(model_or_bridge, tokenizer, record, selector: str = "snapkv", budget: float = 0.10,
                       condition: str = "relay", granularity: str = "turn", mode: str = "completion",
                       model=None, names_filter=None, protect_instructions: bool | None = True,
                       window_size: int = 32) -> RelayActivations:
    """:func:`relay_activations` for one record: render, prefill, select, then the question under ``condition``.

    ``model_or_bridge`` is the Hugging Face model, or a booted bridge together with ``model=`` (the Hugging Face
    model it wraps a copy of, used for the prefill and the selector). ``selector`` is a name with its options as on
    the command line (``snapkv``, ``h2o:recent=4``, ``scissorhands``, ``kvpress:SnapKVPress:window_size=64``); the
    prefill captures what it needs (its query window, H2O / CaM column sums), as :func:`select_history` and the run
    do. ``protect_instructions`` is the framing regime, as ``relaylens run``'s (default: protected, the paper's
    regime, so the export of a run's record shows the run's selection; False: the framing-evicted ablation).
    ``granularity`` picks the evidence units (``turn`` or ``session``); ``mode`` the prompt layout
    (:func:`relaylens.datasets.prompting.render_prompt`); ``window_size`` the prefill's query window (the run's
    ``window_size``, 32).
    """
    hf_model = model if model is not None else model_or_bridge
    if _is_bridge(hf_model):
        raise RelaylensError("record_activations needs the Hugging Face model for the prefill and the selector: pass "
                             "it as model= next to the bridge")
    name, options = parse_selector_arg(selector) if isinstance(selector, str) else (selector, {})
    chosen = make_selector(name, **options) if isinstance(name, str) else name  # an unknown name fails here
    parsed = generation_condition(condition, hf_model)  # probe-only names refused; learned: bound to the model
    factors = require_rotary(hf_model, "record_activations")
    check_learned_use(parsed, hf_model, "record_activations", selector=chosen, budget=budget,  # as relaylens run
                      selector_options=options if isinstance(name, str) else None,
                      protect_instructions=protect_instructions is not False, prompt_mode=mode,
                      granularity=granularity, window_mode="condition")
    prompt = render_prompt(record, tokenizer, mode=mode)
    prefill, selection = select_history(hf_model, prompt.history_ids, chosen, budget, prompt, window_size, factors,
                                        protect_instructions=protect_instructions)
    return relay_activations(model_or_bridge, prefill, selection, parsed, prompt.question_ids,
                             prompt.evidence_mask(granularity), tokenizer=tokenizer, names_filter=names_filter,
                             factors=factors)


def _is_bridge(obj) -> bool:
    return hasattr(obj, "original_model") and hasattr(obj, "hooks")


def _visible(token: str) -> str:
    """A token as a label: line breaks and tabs escaped, a blank token quoted."""
    shown = token.replace("\n", "\\n").replace("\t", "\\t")
    return shown if shown.strip() else repr(token)


def _token_texts(tokenizer, ids: torch.Tensor) -> list[str]:
    if tokenizer is None:
        return [str(int(i)) for i in ids.reshape(-1)]
    return [tokenizer.decode([int(i)]) for i in ids.reshape(-1)]
