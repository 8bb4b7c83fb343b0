"""History prefill: run the history once with the fast attention kernel and keep what later stages need.

Axes: ``layer``, ``kv_head``, ``q_head``, ``pos``, ``window``, ``head_dim`` (:mod:`relaylens.geometry`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from relaylens.errors import PositionError, RopeError, ShapeError
from relaylens.model.attention_stats import capture_column_sums
from relaylens.model.hf import (
    QUERY_RECIPES,
    attention_constants,
    attention_kernel,
    cache_tensors,
    decoder_layers,
    layer_attention,
    new_cache,
)


@dataclass
class PrefillResult:
    """What one history prefill produced. Every selector and condition of a record shares it.

    Attributes:
        history_ids: ``[L]`` long token ids of the history.
        keys: per layer ``[kv_head, L, head_dim]``, post-rotary keys exactly as the model cached them.
        values: per layer ``[kv_head, L, head_dim]``.
        window_queries: per layer ``[q_head, w, head_dim]`` post-rotary queries of the last ``w`` history tokens
            (``None`` when not captured).
        window_size: ``w``.
        scaling: the attention scaling the model applies to ``q @ k^T`` (``1/sqrt(head_dim)`` for Llama).
        num_key_value_groups: query heads per kv head.
        column_sums: per layer ``[q_head, L]`` float32 causal attention column sums of every history query (H2O,
            CaM), captured in the same pass with ``prefill_history(..., column_sums=True)``; None when not captured.
        kept: None for a whole prefill. A compacted prefill (:func:`relaylens.generation.cache.keep_selected`) holds
            only the kept states of one selection, slot-aligned (``keys``/``values`` per layer
            ``[kv_head, slot, head_dim]``), and ``kept`` is that selection: it serves that selection only.
    """

    history_ids: torch.Tensor  # [L]
    keys: list[torch.Tensor]  # per layer [kv_head, L, head_dim]
    values: list[torch.Tensor]  # per layer [kv_head, L, head_dim]
    window_queries: list[torch.Tensor] | None  # per layer [q_head, w, head_dim]
    window_size: int
    scaling: float
    num_key_value_groups: int
    column_sums: list[torch.Tensor] | None = None  # per layer [q_head, L] float32
    kept: object | None = None  # the Selection a compacted prefill holds (keys/values [kv_head, slot, head_dim])

    @property
    def history_length(self) -> int:
        return int(self.history_ids.numel())

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def num_kv_heads(self) -> int:
        return int(self.keys[0].shape[0])


# ----------------------------------------------------------------------------------------------------------------
# prefill_history


def prefill_history(
    model,
    history_ids: torch.Tensor,
    window_size: int = 32,
    chunk_size: int | None = None,
    capture_window_queries: bool = True,
    allow_long: bool = False,
    attn_implementation: str | None = "sdpa",
    column_sums: bool = False,
    column_block_size: int = 256,
) -> PrefillResult:
    """Run the history once (fast kernel, plain ``DynamicCache``) and return its keys, values and window queries.

    The history runs at positions ``0..L-1`` with ``logits_to_keep=1``, optionally in chunks of ``chunk_size`` tokens
    that continue the cache. Queries of the last ``w = window_size`` tokens are rebuilt per layer from the attention
    module's inputs (``q_proj`` -> optional query norm -> the modeling module's own rotary function, with the cos/sin
    the model passed to that layer) by forward pre-hooks that exist only during this call. The rebuilt keys of the
    same tokens are checked against the cache, so an architecture whose attention differs fails loudly.

    Memory: the cache is ``O(L)``; unchunked, sdpa runs causally without an ``L x L`` mask (except sliding-window
    models, whose mask is ``L x L`` booleans); with ``chunk_size=c`` every mask is at most ``c x L``.

    Args:
        model: a Hugging Face causal LM with rotary attention (``model.model.layers[i].self_attn``).
        history_ids: ``[L]`` or ``[1, L]`` token ids.
        window_size: ``w``, the number of final history tokens whose queries are captured (SnapKV-style selectors).
        chunk_size: tokens per forward pass, or None for one pass.
        capture_window_queries: False skips the hooks and returns ``window_queries=None`` and ``window_size=0``.
        allow_long: permit ``L > config.max_position_embeddings``.
        attn_implementation: kernel used during the prefill (restored afterwards); None keeps the model's.
        column_sums: also accumulate every history query's causal attention column sums per layer
            (:func:`relaylens.model.attention_stats.capture_column_sums`, query blocks of ``column_block_size`` rows; no
            ``L x L`` matrix) into :attr:`PrefillResult.column_sums`, for H2O and CaM.

    Example:
        >>> from relaylens.testing import tiny_model
        >>> res = prefill_history(tiny_model("llama"), torch.arange(3, 43), window_size=8)
        >>> res.keys[0].shape, res.window_queries[0].shape, res.num_key_value_groups
        (torch.Size([2, 40, 16]), torch.Size([4, 8, 16]), 2)
    """
    pieces = PrefillPieces(model, history_ids, window_size, chunk_size, capture_window_queries, allow_long,
                            attn_implementation, column_sums, column_block_size)
    for _ in pieces:
        pass
    return pieces.result


class PrefillPieces:
    """:func:`prefill_history` one chunk at a time: iterating runs one chunk's forward per step; ``result`` holds the
    :class:`PrefillResult` once the iteration ends.

    Nothing stays attached to the model between steps (the attention kernel switch and the window-query hooks are
    entered around each chunk), so the chunks of two prefills may run interleaved — ``relaylens bench overhead`` times
    two requests that way. With ``column_sums=True`` the whole prefill is one step (the sums hooks span every chunk).

    Example:
        >>> from relaylens.testing import tiny_model
        >>> pieces = PrefillPieces(tiny_model("llama"), torch.arange(3, 43), window_size=8, chunk_size=16)
        >>> len(list(pieces)), pieces.result.keys[0].shape
        (3, torch.Size([2, 40, 16]))
    """

    def __init__(self, model, history_ids: torch.Tensor, window_size: int = 32, chunk_size: int | None = None,
                 capture_window_queries: bool = True, allow_long: bool = False,
                 attn_implementation: str | None = "sdpa", column_sums: bool = False, column_block_size: int = 256):
        self.ids = _check_history(model, history_ids, window_size, chunk_size, capture_window_queries,
                                  allow_long)  # [L]
        self.model, self.window_size, self.capture_window_queries = model, window_size, capture_window_queries
        self.chunk_size, self.attn_implementation = chunk_size, attn_implementation
        self.column_sums, self.column_block_size = column_sums, column_block_size
        self.result: PrefillResult | None = None

    def __iter__(self):
        model, ids = self.model, self.ids
        L = int(ids.numel())
        layers = decoder_layers(model)
        device = next(model.parameters()).device
        chunk = self.chunk_size or L
        window_start = L - self.window_size if self.capture_window_queries else L
        cache = new_cache()  # plain: a model-config cache would drop sliding-layer history (Gemma-3)
        capture = _WindowQueryCapture(layers, window_start) if self.capture_window_queries else None
        sums = capture_column_sums(model, self.column_block_size) if self.column_sums else contextlib.nullcontext()
        with sums as stats:
            for start in range(0, L, chunk):
                stop = min(start + chunk, L)
                if capture is not None:
                    capture.chunk_start = start
                with attention_kernel(model, self.attn_implementation), torch.inference_mode(), \
                        capture if capture is not None else contextlib.nullcontext():
                    model(
                        input_ids=ids[None, start:stop].to(device),  # [1, c]
                        position_ids=torch.arange(start, stop, device=device)[None],  # [1, c]
                        cache=cache,
                        use_cache=True,
                        logits_to_keep=1,
                    )
                if not self.column_sums and stop < L:
                    yield stop
        # Clones leave inference mode: later stages may edit them in place or use them under autograd.
        keys, values = cache_tensors(cache)
        keys = [k.clone() for k in keys]  # per layer [kv_head, L, head_dim]
        values = [v.clone() for v in values]  # per layer [kv_head, L, head_dim]
        del cache
        if len(keys) != len(layers) or any(k.shape[1] != L for k in keys):
            raise ShapeError(f"the cache holds {[k.shape[1] for k in keys]} positions per layer after a {L}-token "
                             f"prefill of {len(layers)} layers; expected {L} in each. The model may use a cache layer "
                             "that drops history.")
        window_queries = capture.result(keys) if capture is not None else None  # per layer [q_head, w, head_dim]
        scaling, groups = attention_constants(model)
        self.result = PrefillResult(
            history_ids=ids.cpu(),
            keys=keys,
            values=values,
            window_queries=window_queries,
            window_size=self.window_size if self.capture_window_queries else 0,
            scaling=scaling,
            num_key_value_groups=groups,
            column_sums=[s.clone() for s in stats.column_sums] if self.column_sums else None,
        )
        yield L


def _check_history(model, history_ids, window_size, chunk_size, capture, allow_long) -> torch.Tensor:
    ids = torch.as_tensor(history_ids)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ShapeError(f"history_ids must be [L] or [1, L] token ids; got shape {tuple(ids.shape)}")
    if ids.dtype not in (torch.long, torch.int, torch.int32, torch.int64):
        raise ShapeError(f"history_ids must be integer token ids; got dtype {ids.dtype}")
    L = int(ids.numel())
    if L == 0:
        raise ShapeError("history_ids is empty; prefill needs at least one history token (and at least window_size "
                         "tokens when window queries are captured)")
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    vocab = getattr(embeddings, "num_embeddings", None)  # rows of the embedding table (>= config.vocab_size)
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab is not None and high >= vocab):
        raise ShapeError(f"history_ids hold token ids {low}..{high}, outside the model's vocabulary "
                         f"0..{vocab - 1 if vocab else '?'}; the tokenizer does not belong to this model. Fix: load "
                         "the tokenizer saved with the model")
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and L > limit and not allow_long:
        raise PositionError(f"history of {L} tokens exceeds the model's max_position_embeddings={limit}; positions "
                            f"past it are outside the trained rotary range. Fix: truncate the history, or pass "
                            f"allow_long=True to run it anyway.")
    if chunk_size is not None and chunk_size <= 0:
        raise ShapeError(f"chunk_size must be a positive number of tokens or None; got {chunk_size}")
    if capture:
        if window_size <= 0:
            raise ShapeError(f"window_size must be >= 1 when capturing window queries; got {window_size}. "
                             "Fix: pass capture_window_queries=False to skip them.")
        if L < window_size:
            raise ShapeError(f"history of {L} tokens is shorter than window_size={window_size}; expected L >= w. "
                             "Fix: lower window_size or pass capture_window_queries=False.")
    return ids.long()


# ----------------------------------------------------------------------------------------------------------------
# window queries: rebuilt from each attention module's inputs, exactly as its forward computes them (relaylens.model.hf)


class _WindowQueryCapture:
    """Forward pre-hooks on every ``self_attn`` that rebuild post-rotary queries (and keys, for the check) of the
    positions ``>= window_start``. Hooks exist only inside ``with``; set ``chunk_start`` before each forward."""

    def __init__(self, layers: list, window_start: int):
        self.layers, self.window_start, self.chunk_start = layers, window_start, 0
        self.recipes = []
        for layer in layers:
            name = type(layer_attention(layer)).__name__
            if name not in QUERY_RECIPES:
                raise RopeError(f"cannot rebuild window queries for attention class {name}; supported: "
                                f"{', '.join(sorted(QUERY_RECIPES))}. Fix: add a recipe to "
                                "relaylens.model.hf.QUERY_RECIPES or pass capture_window_queries=False.")
            self.recipes.append(QUERY_RECIPES[name])
        self.queries: list[list[torch.Tensor]] = [[] for _ in layers]  # per layer, pieces [q_head, n, head_dim]
        self.keys: list[list[torch.Tensor]] = [[] for _ in layers]  # per layer, pieces [kv_head, n, head_dim]
        self.handles: list = []

    def __enter__(self):
        try:
            for i, layer in enumerate(self.layers):
                self.handles.append(layer_attention(layer).register_forward_pre_hook(self._hook(i), with_kwargs=True))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        return False

    def _hook(self, i: int):
        def hook(module, args, kwargs):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]  # [1, c, hidden]
            cos, sin = kwargs["position_embeddings"]  # [1, c, rot_dim] each
            first = max(self.window_start - self.chunk_start, 0)
            if first >= hidden.shape[1]:
                return None
            q, k = self.recipes[i](module, hidden[:, first:], cos[:, first:], sin[:, first:])
            self.queries[i].append(q[0])  # [q_head, n, head_dim]
            self.keys[i].append(k[0])  # [kv_head, n, head_dim]
            return None

        return hook

    def result(self, cached_keys: list[torch.Tensor]) -> list[torch.Tensor]:
        """Concatenated window queries per layer ``[q_head, w, head_dim]``, after checking the rebuilt keys."""
        out = []
        for i, (qs, ks) in enumerate(zip(self.queries, self.keys)):
            q, k = torch.cat(qs, dim=1), torch.cat(ks, dim=1)  # [q_head, w, D], [kv_head, w, D]
            ref = cached_keys[i][:, self.window_start:]  # [kv_head, w, D]
            err = (k.float() - ref.float()).abs().max().item()
            # Same ops on a slice: equal up to kernel blocking, i.e. a few ulps of the model dtype.
            tol = max(1e-4, 8 * torch.finfo(ref.dtype).eps) * (1.0 + ref.float().abs().max().item())
            if k.shape != ref.shape or not err <= tol:
                raise RopeError(f"layer {i}: keys rebuilt by the {type(layer_attention(self.layers[i])).__name__} "
                                f"recipe differ from the cached keys (max abs {err:.3g}, tolerance {tol:.3g}), so its "
                                "rebuilt queries cannot be trusted. Fix: correct relaylens.model.hf.QUERY_RECIPES for "
                                "this class or pass capture_window_queries=False.")
            out.append(q.clone())
        return out
