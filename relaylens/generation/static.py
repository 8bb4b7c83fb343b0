"""Static-shape greedy decoding: a decoding step whose shapes do not change from step to step.

:func:`relaylens.generation.rows.decode_steps` (the *dynamic* path) grows the cache by concatenation, drops rows as
they stop, reads every row's token to the host and decodes each row's text for newline stops, once per step.
:func:`decode_static` decodes the same rows with every shape fixed for the whole answer:

- each layer's cache is one preallocated buffer ``[row, kv_head, slot, head_dim]``: the row's history slots (padded to
  the batch's widest row, invalid), the question, then ``max_new_tokens - 1`` answer slots; a step writes its token's
  key and value into answer slot ``step`` in place (:func:`relaylens.model.hf.slot_cache`);
- visibility is a bool buffer per layer ``[row, kv_head, slot]`` (answer slot ``step`` turns visible as it is
  written), and sliding windows compare each slot's precomputed position with the query's, all on the device;
- a row that stops stays in the batch, masked: its later tokens are computed and ignored;
- the greedy token, the stop tests (:class:`relaylens.generation.stops.StopTable`: EOS and newline stops from
  token ids), the positions and the step counter stay on the device; the host reads whether every row has stopped
  once every ``sync_every`` steps, and the tokens once, at the end.

So one step (:func:`advance`) traces as one graph: ``torch.compile(advance, fullgraph=True)`` compiles it once and
replays it at every step without recompiling (test), the precondition for capturing it as a CUDA graph. Buffers are
padded to a multiple of ``slot_multiple`` slots, so records of similar widths share one compiled graph.

The tokens equal the dynamic path's (test, over rope variants, windows and stop rules) up to float rounding: a stopped
row keeps the batch's shape instead of leaving it, and padded slots add exact zeros to the softmax. Newline stops
that the per-token table may resolve differently from decoding the text (a SentencePiece lone leading space) are
checked on the host after decoding; :func:`decode_static` returns False when one disagrees and the caller decodes the
dynamic way (its cache is left untouched).

Axes: ``row``, ``layer``, ``kv_head``, ``slot``, ``head_dim``, ``vocab`` (:mod:`relaylens.geometry`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from relaylens.generation.attention import attend_unobserved
from relaylens.generation.stops import EOS, NEWLINE, StopTable, text_stop_index
from relaylens.model.hf import (
    attention_kernel,
    attention_layer_index,
    attention_window,
    cache_data,
    register_attention_function,
    slot_cache,
)
from relaylens.model.packed import pack_linears, packed_linears

STATIC_ATTENTION = "relaylens_static"
_ALWAYS = 10**9  # window-frame position of a history slot under window_mode="none": inside every window


@dataclass
class StaticRows:
    """Every buffer of a static decode; all on the model's device, mutated in place by :func:`advance`."""

    cache: object  # relaylens.model.hf.slot_cache
    bases: tuple[torch.Tensor, ...]  # per layer [] long: the first answer slot
    allow: tuple[torch.Tensor, ...]  # per layer [row, kv_head, slot] bool
    frame_positions: tuple[torch.Tensor, ...]  # per layer [row, kv_head, slot] long: positions in the window frame
    step: torch.Tensor  # [] long: tokens chosen so far
    positions: torch.Tensor  # [row] long: position the next token is fed at
    frame_query: torch.Tensor  # [row] long: that position in the window frame
    tokens: torch.Tensor  # [row, max_new_tokens] long
    codes: torch.Tensor  # [row] long: stop code (0 running, EOS, NEWLINE)
    stopped_at: torch.Tensor  # [row] long: index of the stopping token (-1: none)
    seen_content: torch.Tensor  # [row] bool


def static_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention of a static step: query ``[row, q_head, 1, D]`` over every slot ``[row, kv_head, slot, D]``."""
    layer = attention_layer_index(module)
    allow = kwargs["relaylens_allow"][layer]  # [row, kv_head, slot]
    window = attention_window(module, kwargs)
    if window:
        inside = (kwargs["relaylens_frame_query"][:, None, None] - kwargs["relaylens_frame_positions"][layer]) < window
        allow = allow & inside
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    output = attend_unobserved(query, key, value, allow[:, :, None], scale, kwargs.get("softcap"))
    return output.transpose(1, 2).contiguous(), None


register_attention_function(STATIC_ATTENTION, static_attention)


def choose(rows: StaticRows, current: torch.Tensor, table: StopTable) -> torch.Tensor:
    """Pick each row's greedy token from ``current`` ``[row, vocab]``, record it and its stop; returns ``[row]``."""
    token = current.argmax(-1)  # [row]
    rows.tokens.index_copy_(1, rows.step.reshape(1), token[:, None])
    code, seen = table.stops(token, rows.seen_content)
    newly = (code > 0) & (rows.codes == 0)
    rows.stopped_at.copy_(torch.where(newly, rows.step, rows.stopped_at))
    rows.codes.copy_(torch.where(newly, code, rows.codes))
    rows.seen_content.copy_(seen)
    return token


def advance(model, rows: StaticRows, current: torch.Tensor, table: StopTable) -> torch.Tensor:
    """One decoding step: choose each row's token, feed it in its answer slot; the next logits ``[row, vocab]``."""
    token = choose(rows, current, table)
    for allow, base in zip(rows.allow, rows.bases):
        allow.index_fill_(2, (base + rows.step).reshape(1), True)
    out = model(input_ids=token[:, None], position_ids=rows.positions[:, None], cache=rows.cache, use_cache=True,
                logits_to_keep=1, relaylens_allow=rows.allow, relaylens_frame_positions=rows.frame_positions,
                relaylens_frame_query=rows.frame_query)
    rows.positions.add_(1)
    rows.frame_query.add_(1)
    rows.step.add_(1)
    return out.logits[:, -1].float()


@functools.lru_cache(maxsize=8)
def compiled_advance(backend: str):
    """:func:`advance` compiled as one graph (``fullgraph=True``) with ``backend`` (``"inductor"``, ``"eager"``)."""
    return torch.compile(advance, fullgraph=True, dynamic=False, backend=backend)


def static_rows(batch, next_position: torch.Tensor, next_source: torch.Tensor, max_new_tokens: int,
                slot_multiple: int = 64) -> StaticRows:
    """The static buffers of a :class:`relaylens.generation.rows.RowBatch` after its question pass (copies: the
    batch is left as it was). ``next_position``/``next_source`` ``[row]``: where each row's first answer token goes."""
    state, device = batch.state, next_position.device
    rows, answer = next_position.shape[0], max(max_new_tokens - 1, 0)
    source_frame = state.window_mode == "source" and state.new_source_positions is not None
    new_frame = (state.new_source_positions if source_frame else state.new_positions).to(device)  # [row, Q]
    answer_frame = (next_source if source_frame else next_position)[:, None] + torch.arange(answer, device=device)
    step = torch.zeros((), dtype=torch.long, device=device)
    data, bases, allow, frames = [], [], [], []
    for index, (keys, values) in enumerate(cache_data(batch.cache)):  # [row, kv_head, history + Q, head_dim]
        kv_heads, filled = keys.shape[1], keys.shape[2]
        slots = -(-(filled + answer) // slot_multiple) * slot_multiple
        pad = slots - filled
        data.append((torch.nn.functional.pad(keys, (0, 0, 0, pad)), torch.nn.functional.pad(values, (0, 0, 0, pad))))
        bases.append(torch.tensor(filled, device=device))
        history = filled - new_frame.shape[-1]
        valid = state.valid.get(index)
        valid = (torch.ones(rows, kv_heads, history, dtype=torch.bool, device=device) if valid is None
                 else valid.to(device).expand(rows, kv_heads, history))
        allow.append(torch.cat((valid, torch.ones(rows, kv_heads, filled - history, dtype=torch.bool, device=device),
                                torch.zeros(rows, kv_heads, pad, dtype=torch.bool, device=device)), dim=-1))
        hist = (state.source_positions if source_frame else state.key_positions).get(index)
        hist = (torch.zeros(rows, kv_heads, history, dtype=torch.long, device=device) if hist is None
                else hist.to(device).expand(rows, kv_heads, history))
        if state.window_mode == "none":
            hist = torch.full_like(hist, _ALWAYS)
        tail = torch.cat((new_frame, answer_frame), dim=-1)[:, None].expand(-1, kv_heads, -1)  # [row, kv, Q + answer]
        frames.append(torch.nn.functional.pad(torch.cat((hist, tail), dim=-1), (0, slots - filled - answer)))
    frame_query = (next_source if source_frame else next_position).clone()
    return StaticRows(slot_cache(data, bases, step), tuple(bases), tuple(allow), tuple(frames), step,
                      next_position.clone(), frame_query,
                      torch.zeros(rows, max(max_new_tokens, 1), dtype=torch.long, device=device),
                      torch.zeros(rows, dtype=torch.long, device=device),
                      torch.full((rows,), -1, dtype=torch.long, device=device),
                      torch.zeros(rows, dtype=torch.bool, device=device))


def decode_static(model, batch, results, current: torch.Tensor, next_position: torch.Tensor,
                  next_source: torch.Tensor, settings) -> bool:
    """Greedy decoding of every row with static shapes; fills ``results`` as the dynamic path does and returns True,
    or returns False (``results`` untouched) when a newline stop checked on the host disagrees with the device's.

    ``settings``: a :class:`~relaylens.generation.settings.DecodeSettings` (its ``sync_every`` and
    ``compile_backend``; EOS ids as given, None: none). A step run eagerly uses the CPU's prepacked linear layers
    (:mod:`relaylens.model.packed`), as the dynamic path does; a compiled one does not.
    """
    max_new_tokens, tokenizer, backend = settings.max_new_tokens, settings.tokenizer, settings.compile_backend
    if max_new_tokens <= 0:
        return True
    device = current.device
    rows = static_rows(batch, next_position.to(device), next_source.to(device), max_new_tokens)
    table = StopTable.build(tokenizer, settings.eos_token_ids or (), current.shape[-1], settings.stop_at_newline,
                            device=device)
    step_fn = advance if backend is None else compiled_advance(backend)
    packs = pack_linears(model) if backend is None and max_new_tokens > 1 else []  # built once per model
    with torch.no_grad(), attention_kernel(model, STATIC_ATTENTION):
        for step in range(max_new_tokens - 1):
            with packed_linears(packs):
                current = step_fn(model, rows, current, table)
            if (step + 1) % settings.sync_every == 0 and bool((rows.codes > 0).all()):
                break
        else:
            choose(rows, current, table)
    return _fill_results(results, rows, next_position, max_new_tokens, tokenizer, table)


def _fill_results(results, rows: StaticRows, next_position: torch.Tensor, max_new_tokens: int, tokenizer,
                  table: StopTable) -> bool:
    """Copy the device's answers into ``results`` (one host read); False when a newline stop disagrees with the text."""
    tokens, codes, stopped_at = rows.tokens.tolist(), rows.codes.tolist(), rows.stopped_at.tolist()
    answers = []
    for row, code in enumerate(codes):
        count = stopped_at[row] + 1 if code else max_new_tokens
        ids = tokens[row][:count]
        if table.stop_at_newline:
            at = text_stop_index(tokenizer, ids, table)
            if (code == NEWLINE) != (at is not None) or (at is not None and at != count - 1):
                return False
        answers.append((ids, {EOS: "eos", NEWLINE: "newline"}.get(code, "limit")))
    starts = next_position.tolist()
    for result, (ids, reason), start in zip(results, answers, starts):
        result.token_ids.extend(ids)
        result.stop_reason = reason
        result.positions.extend(start + offset for offset in range(len(ids) - 1))
    return True
