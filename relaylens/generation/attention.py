"""The ``relaylens`` attention function: per-(layer, kv_head) validity, causal new tokens, windows on coordinates.

Registered with ``transformers.AttentionInterface`` under the name ``"relaylens"`` and selected only inside
:func:`attention_context`, which restores the model's previous implementation on exit. Because no mask function is
registered under that name, transformers passes ``attention_mask=None`` and this function builds its own mask from
the key length of every call (ragged layer widths work; a ``None`` mask is never forwarded to sdpa).

Axes: ``q_head``, ``kv_head``, ``query``, ``key`` (:mod:`relaylens.geometry`). History slot ``j`` of kv head ``h`` is
visible iff ``valid[l][h, j]``; new token keys are causal among themselves.

Example:
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> model = tiny_model("llama")
    >>> state = AttentionState(new_positions=torch.arange(4))
    >>> with attention_context(model, state):
    ...     logits = model(torch.tensor([[5, 6, 7, 8]]), position_ids=torch.arange(4)[None]).logits
    >>> from relaylens.model.hf import attention_kernel_name
    >>> attention_kernel_name(model)
    'sdpa'
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import torch

from relaylens.errors import RelaylensError
from relaylens.model.hf import attention_kernel, attention_layer_index, attention_window, register_attention_function

ATTENTION_NAME = "relaylens"
FUSED_UNOBSERVED = True  # unobserved passes use the fused kernel (:func:`_attend_fused`); False: always :func:`_attend`
WINDOW_MODES = ("condition", "source", "none")

#: observer(layer, query, key, value, probs, state); query [B, q_head, query, D] post-rotary, key/value
#: [B, kv_head, key, D], probs float32 [B, q_head, query, key]
Observer = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, "AttentionState"], None]


@dataclass
class AttentionState:
    """What the attention function needs beyond the tensors transformers hands it.

    One row (a sequential run) stores the per-layer tensors without a batch axis; a batch of ``B`` rows (see
    :mod:`relaylens.generation.rows`) stores them with a leading ``[B, ...]`` axis, one row per (selection, condition).

    Attributes:
        valid: per layer ``[kv_head, N_l]`` (or ``[B, kv_head, N_l]``) bool validity of the cached history slots
            (absent: all valid).
        key_positions: per layer ``[kv_head, N_l]`` (or ``[B, kv_head, N_l]``) long condition positions of the
            history slots (windows).
        source_positions: per layer, same shape, long source positions (``window_mode="source"``).
        new_positions: ``[T]`` (or ``[B, T]``) long positions of every new token fed so far (question, then
            generated tokens); the runtime extends it before each forward.
        new_source_positions: ``[T]`` (or ``[B, T]``) positions of the new tokens in the source frame (``L + t``).
        window_mode: sliding-window layers under a relocated cache: ``"condition"`` (a query at ``u`` sees kept
            keys with ``u - p' < window``; the default), ``"source"`` (window measured on source positions) or
            ``"none"`` (cached history always visible; new tokens still windowed).
        observers: callables receiving each layer's tensors and probabilities (probes), for the whole batch.
        row_observers: per batch row, observers that receive that row alone exactly as a sequential run would show
            it: history cut to the row's own width, with ``row_states[b]`` (the row's unpadded state) as ``state``.
        row_states: per batch row, the row's own unbatched :class:`AttentionState` (set with ``row_observers``).
            A pass with ``row_observers`` computes attention row by row on each row's own slots (exact readouts).
        row_teacher_observers: per batch row, observers of a teacher-forced token fed as the last token of the same
            call as the question: ``row_observers`` then see the call without it, these the whole call.
        head_inputs: ``None`` (default), or a dict the attention fills with each call's per-query-head views of the
            keys and values, ``layer -> [(key, value)]`` each ``[B, q_head, key, D]`` (the kv head's tensor indexed
            once per query head): gradients taken w.r.t. them split a shared kv head's gradient by query head.
            Filled only by the differentiable path (``run_condition(..., grad=True)``).
    """

    valid: dict[int, torch.Tensor] = field(default_factory=dict)
    key_positions: dict[int, torch.Tensor] = field(default_factory=dict)
    source_positions: dict[int, torch.Tensor] = field(default_factory=dict)
    new_positions: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    new_source_positions: torch.Tensor | None = None
    window_mode: str = "condition"
    observers: list[Observer] = field(default_factory=list)
    row_observers: list[list[Observer]] = field(default_factory=list)
    row_states: list[AttentionState] = field(default_factory=list)
    row_teacher_observers: list[list[Observer]] = field(default_factory=list)
    head_inputs: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] | None = None

    def __post_init__(self) -> None:
        if self.window_mode not in WINDOW_MODES:
            raise RelaylensError(f"window_mode must be one of {WINDOW_MODES}; got {self.window_mode!r}. Fix: pass one "
                                 "of those")


_ACTIVE: contextvars.ContextVar[AttentionState | None] = contextvars.ContextVar("relaylens_attention", default=None)


def _batched(tensor: torch.Tensor | None, dims: int) -> torch.Tensor | None:
    """Add the leading batch axis to an unbatched per-row tensor (``dims``: rank without the batch axis)."""
    return tensor if tensor is None or tensor.dim() > dims else tensor[None]


def window_allow(state: AttentionState, layer: int, history: int, total: int, q_len: int, window: int,
                 device) -> torch.Tensor | None:
    """Bool mask of the keys inside the sliding window of each query.

    Shape ``[kv_head or 1, query, key]`` for an unbatched state, ``[B, kv_head or 1, query, key]`` for a batched one.
    """
    unbatched = state.new_positions.dim() == 1
    if state.window_mode == "source" and state.new_source_positions is not None:
        hist, new = state.source_positions.get(layer), state.new_source_positions
    else:
        hist, new = state.key_positions.get(layer), state.new_positions
    new = _batched(new, 1)[:, : total - history].to(device)  # [B, new] positions of new-token keys so far
    if new.shape[-1] != total - history:
        raise RuntimeError(f"layer {layer}: {total - history} new keys but only {new.shape[-1]} new positions recorded")
    queries = new[:, -q_len:]  # [B, query]
    if history and hist is None:
        raise RuntimeError(f"layer {layer}: sliding window needs the history key positions of the condition")
    if history:
        hist = _batched(hist, 2).to(device)  # [B, kv_head, N]
        keys = torch.cat((hist, new[:, None].expand(-1, hist.shape[1], -1)), dim=-1)  # [B, kv_head, key]
    else:
        keys = new[:, None]  # [B, 1, key]
    allow = (queries[:, None, :, None] - keys[:, :, None, :]) < window  # [B, kv_head or 1, query, key]
    if state.window_mode == "none" and history:
        allow[..., :history] = True
    return allow[0] if unbatched else allow


def relaylens_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention with per-(row, layer, kv_head) history validity, built from the shapes of this call.

    The positional order after the mask is ``dropout, scaling``, as transformers' sdpa function has it: ``import
    kvpress`` wraps every registered attention function and calls it with ``dropout`` as the sixth positional argument.

    Shapes: query ``[B, q_head, query, D]``, key/value ``[B, kv_head, key, D]`` (history slots, then new tokens).
    Returns ``([B, query, q_head, D], probs [B, q_head, query, key])``.
    """
    state = _ACTIVE.get()
    if state is None:
        raise RuntimeError("the 'relaylens' attention implementation runs only inside "
                           "relaylens.generation.attention.attention_context(...)")
    layer = attention_layer_index(module)
    _, q_heads, q_len, head_dim = query.shape
    kv_heads, total = key.shape[1], key.shape[-2]
    groups = q_heads // kv_heads
    scale = scaling if scaling is not None else head_dim**-0.5
    valid = _batched(state.valid.get(layer), 2)  # [B or 1, kv_head, N]
    history = 0 if valid is None else valid.shape[-1]

    rows = torch.arange(q_len, device=query.device)[:, None]
    cols = torch.arange(total, device=query.device)[None]
    allow = (cols <= total - q_len + rows)[None, None]  # [1, 1, query, key] causal among new tokens
    if valid is not None:
        history_allow = valid.to(query.device)[:, :, None, :].expand(-1, -1, q_len, -1)  # [B, kv_head, query, N]
        allow = torch.cat((history_allow, allow[..., history:].expand(history_allow.shape[0], kv_heads, -1, -1)),
                          dim=-1)
    window = attention_window(module, kwargs)
    if window:
        inside = window_allow(state, layer, history, total, q_len, int(window), query.device)
        allow = allow & (inside if inside.dim() == 4 else inside[None])

    if state.row_observers and state.head_inputs is None:  # an observed pass: each row on its own slots
        output, probs = _attend_rows(state, layer, history, query, key, value, allow, scale, kwargs.get("softcap"))
    elif state.head_inputs is not None:  # differentiable path: one view of the keys/values per query head
        kv_of = torch.arange(q_heads, device=key.device) // groups
        per_head = (key[:, kv_of], value[:, kv_of])  # [B, q_head, key, D] each
        state.head_inputs.setdefault(layer, []).append(per_head)
        output, probs = _attend(query, *per_head, allow.expand(-1, kv_heads, -1, -1)[:, kv_of], scale,
                                kwargs.get("softcap"))
    elif FUSED_UNOBSERVED and not state.observers and not kwargs.get("softcap"):
        # nobody reads the probabilities: the fused kernel
        output, probs = _attend_fused(query, key, value, allow, scale), None
    else:
        output, probs = _attend(query, key, value, allow, scale, kwargs.get("softcap"))
    for observer in state.observers:
        observer(layer, query, key, value, probs, state)
    output = output.transpose(1, 2).contiguous()  # [B, query, q_head, D]
    return output, None if probs is None else probs.to(query.dtype)


def attend_unobserved(query, key, value, allow, scale: float, softcap: float | None = None) -> torch.Tensor:
    """Output ``[B, q_head, query, D]`` of a pass no probe observes, as :func:`relaylens_attention` computes it: the
    fused kernel (:data:`FUSED_UNOBSERVED`), relaylens's own under attention softcapping. ``allow`` as in
    :func:`_attend`."""
    if FUSED_UNOBSERVED and not softcap:
        return _attend_fused(query, key, value, allow, scale)
    return _attend(query, key, value, allow, scale, softcap)[0]


def _attend(query, key, value, allow, scale: float, softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention: ``(output [B, q_head, query, D], probs float32 [B, q_head, query, key])``.

    ``key``/``value`` ``[B, kv_head, key, D]`` serve ``q_head // kv_head`` query heads each; ``allow``
    ``[B or 1, kv_head or 1, query, key]``.
    """
    batch, q_heads, q_len, head_dim = query.shape
    kv_heads, total = key.shape[1], key.shape[-2]
    groups = q_heads // kv_heads
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32  # float64 for gradcheck
    grouped = query.reshape(batch, kv_heads, groups * q_len, head_dim)  # q_head h*groups+g → kv_head h
    scores = torch.matmul(grouped.to(compute),
                          key.to(compute).transpose(-1, -2)) * scale  # [B, kv_head, groups*query, key]
    scores = scores.view(batch, kv_heads, groups, q_len, total)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allow[:, :, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # float32 (float64) [B, kv_head, groups, query, key]
    output = torch.matmul(probs.view(batch, kv_heads, groups * q_len, total).to(value.dtype), value)
    return output.view(batch, q_heads, q_len, head_dim), probs.view(batch, q_heads, q_len, total)


def _attend_fused(query, key, value, allow, scale: float) -> torch.Tensor:
    """:func:`_attend` without its probabilities (decoding steps, unobserved passes): ``torch``'s fused
    scaled-dot-product kernel in the tensors' own dtype (float32 accumulation inside), no upcast copy of the cache.

    The ``groups`` query heads of a kv head ride as ``groups * query`` query rows of that kv head, so the kernel reads
    each kv head's keys once (its ``enable_gqa`` path copies them per query head). Output ``[B, q_head, query, D]``.
    """
    batch, q_heads, q_len, head_dim = query.shape
    kv_heads, total = key.shape[1], key.shape[-2]
    groups = q_heads // kv_heads
    grouped = query.reshape(batch, kv_heads, groups * q_len, head_dim)  # q_head h*groups+g → kv_head h
    mask = allow[:, :, None].expand(allow.shape[0], allow.shape[1], groups, q_len, total)  # [B|1, kv|1, g, query, key]
    mask = mask.reshape(allow.shape[0], allow.shape[1], groups * q_len, total)
    output = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scale)
    return output.reshape(batch, q_heads, q_len, head_dim)  # CUDA kernels may return a non-contiguous layout


def _attend_rows(state: AttentionState, layer: int, history: int, query, key, value, allow, scale: float,
                 softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_attend` one row at a time on the row's own history width, then the row's observers.

    Each row computes with exactly the shapes a sequential run of it computes (padding slots dropped, not masked), so
    its probabilities and output are those of the row alone: batched readouts equal sequential ones. With
    ``row_teacher_observers``, the call's last new token is a teacher-forced token: ``row_observers`` see the call
    without it (its query and key dropped), ``row_teacher_observers`` the whole call.
    """
    total = key.shape[-2]
    outputs, probs = [], None
    for row, observers in enumerate(state.row_observers):
        row_state = state.row_states[row]
        own = row_state.valid[layer].shape[-1] if layer in row_state.valid else 0
        pick = slice(row, row + 1)
        k, v, a = key[pick], value[pick], allow[pick if allow.shape[0] > 1 else slice(0, 1)]
        if own < history:  # padded to a wider row of the batch: keep its own slots and the new tokens
            keep = torch.cat((torch.arange(own), torch.arange(history, total))).to(key.device)
            k, v, a = k.index_select(2, keep), v.index_select(2, keep), a.index_select(3, keep)  # [1, ., own + new, .]
        out, p = _attend(query[pick], k, v, a, scale, softcap)  # [1, q_head, query, D], [1, q_head, query, own + new]
        outputs.append(out)
        if probs is None:
            probs = p.new_zeros(query.shape[:3] + (total,))  # [B, q_head, query, key]; padding slots stay 0
        if own < history:
            probs[pick].index_copy_(3, keep, p)
        else:
            probs[pick] = p
        if state.row_teacher_observers:  # the question's observers see the call without the teacher-forced token
            asked = replace(row_state, new_positions=row_state.new_positions[:-1],
                            new_source_positions=None if row_state.new_source_positions is None
                            else row_state.new_source_positions[:-1])
            for observer in observers:
                observer(layer, query[pick, :, :-1], k[:, :, :-1], v[:, :, :-1], p[:, :, :-1, :-1], asked)
            observers = state.row_teacher_observers[row]
        for observer in observers:
            observer(layer, query[pick], k, v, p, row_state)
    return torch.cat(outputs), probs


register_attention_function(ATTENTION_NAME, relaylens_attention)


@contextlib.contextmanager
def attention_context(model, state: AttentionState) -> Iterator[AttentionState]:
    """Run ``model`` with the relaylens attention function and ``state``; restores everything on exit."""
    token = _ACTIVE.set(state)
    try:
        with attention_kernel(model, ATTENTION_NAME):
            yield state
    finally:
        _ACTIVE.reset(token)
