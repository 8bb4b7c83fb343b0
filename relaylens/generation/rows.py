"""Batched rows: every (selection, condition) of a record decoded together over one shared prefill.

A *row* is one (selection, condition) pair, optionally with probe observers. :func:`run_rows` builds each row's
relocated cache exactly as :func:`relaylens.generation.cache.build_cache` does, pads every layer to the widest row of
the batch (padding slots are invalid and never receive probability mass), and runs the question pass, the optional
teacher-forced token and greedy decoding for all rows in one batch. Each row keeps its own validity mask, key positions,
question positions, sliding-window coordinates and stop state; a row that stops (EOS, newline, limit) is dropped from
the batch, so it costs no further work. A batch of one row is the sequential path
(:func:`relaylens.generation.single.run_condition` calls :func:`run_rows` with one row).

Exact readouts: a pass with observers (probes) computes attention row by row on each row's own slots, so every
row's probabilities are computed with the shapes its sequential run uses; the teacher-forced token rides in the
question pass as one more token (causal, so the question's own results do not see it; it is forgotten afterwards),
so its linear layers run on ``Q + 1`` tokens per row, batched or not. Linear layers on this CPU (MKL 2024.2,
AVX-512) round each row of a batch as that row alone when rows have 4, 8 or at least 12 tokens (measured), so batched
readouts then equal sequential ones bit for bit; otherwise, and in decoding steps (one token per row), they differ
by float32 rounding only.

Axes: ``batch_row`` (``row`` in shape comments), ``layer``, ``kv_head``, ``slot`` (padded to the widest
row of the layer), ``head_dim``; ``Q`` question tokens, ``T`` new tokens fed so far (:mod:`relaylens.geometry`).

Example:
    >>> import torch
    >>> from relaylens.testing import tiny_model
    >>> from relaylens.generation.single import prefill_from_cache, run_condition
    >>> from relaylens.geometry.selection import Selection
    >>> model = tiny_model("llama")
    >>> history, question = torch.arange(3, 40), torch.tensor([50, 51, 52])
    >>> pre = prefill_from_cache(history, model(history[None], use_cache=True).cache, model)
    >>> sel = Selection.from_lists([[[0, 5, 30], [2, 3, 9, 36]]] * 2, pre.history_length)
    >>> rows = [Row(sel, "original"), Row(sel, "relay")]
    >>> batched = run_rows(model, pre, rows, question, max_new_tokens=4, eos_token_ids=set())
    >>> [r.question_start for r in batched]
    [37, 4]
    >>> one = run_condition(model, pre, sel, "relay", question, max_new_tokens=4, eos_token_ids=set())
    >>> one.token_ids == batched[1].token_ids
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from relaylens.conditions.catalogue import Condition, Coordinates
from relaylens.errors import ShapeError
from relaylens.generation import attention as attention_module
from relaylens.generation.attention import AttentionState, Observer, attention_context
from relaylens.generation.cache import RelocatedLayers, relocate_selection
from relaylens.generation.positions import new_token_phases, position_ids
from relaylens.generation.settings import DecodeSettings
from relaylens.generation.stops import newline_stop
from relaylens.geometry.rotary import RotaryFactors
from relaylens.geometry.selection import Selection
from relaylens.model.hf import cache_from_tensors, crop_cache, select_cache_rows
from relaylens.model.packed import decoding_linears, pack_linears, packed_linears
from relaylens.model.prefill import PrefillResult

_FAR = -(10**9)  # position of a padding slot: never inside a window, never attended (its validity is False)


@dataclass
class GenerationResult:
    """Outcome of one condition: logits of the question pass and the greedy continuation."""

    condition: str
    question_start: int
    question_positions: torch.Tensor  # [Q]
    last_logits: torch.Tensor  # [vocab] float32, logits of the final question token
    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)  # position each generated token was fed at (if fed)
    text: str = ""
    stop_reason: str = "limit"  # "eos", "newline", "limit"
    question_logits: torch.Tensor | None = None  # [Q, vocab] when requested
    teacher_logits: torch.Tensor | None = None  # [vocab] logits of the teacher-forced token, when one was fed
    inputs: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # grad=True: RelocatedCache.inputs
    head_inputs: dict | None = None  # grad=True: layer -> [(key, value) per-query-head views per pass], question first

    @property
    def hit_limit(self) -> bool:
        """True when ``max_new_tokens`` cut the answer (it may be incomplete)."""
        return self.stop_reason == "limit"


@dataclass(frozen=True)
class Row:
    """One (selection, condition) of a record, with observers for its question pass and teacher-forced token."""

    selection: Selection
    condition: str | Condition | Coordinates
    observers: tuple[Observer, ...] = ()
    teacher_observers: tuple[Observer, ...] = ()


@dataclass
class RowBatch:
    """The batched cache of some rows and the attention state that goes with it (rows drop out as they stop)."""

    cache: object  # a transformers DynamicCache (built by relaylens.model.hf.cache_from_tensors)
    state: AttentionState  # per layer [row, kv_head, slot]; new_positions [row, T]
    layers: list[RelocatedLayers]  # per row: its own unpadded state and coordinates
    factors: RotaryFactors | None = None  # the model's factors: phases of real-valued new-token positions


def stack_rows(built: list[RelocatedLayers], window_mode: str = "condition") -> RowBatch:
    """Pad each layer of every row to the layer's widest row and stack them along a leading row axis."""
    state = AttentionState(window_mode=window_mode, new_positions=torch.zeros(len(built), 0, dtype=torch.long),
                           new_source_positions=torch.zeros(len(built), 0, dtype=torch.long))
    data = []
    for layer in range(len(built[0].data)):
        width = max(row.widths[layer] for row in built)
        keys, values, valid, key_pos, src_pos = [], [], [], [], []
        for row in built:
            pad = width - row.widths[layer]
            k, v = row.data[layer]  # [kv_head, slot, head_dim]
            keys.append(torch.nn.functional.pad(k, (0, 0, 0, pad)))
            values.append(torch.nn.functional.pad(v, (0, 0, 0, pad)))
            valid.append(torch.nn.functional.pad(row.state.valid[layer], (0, pad), value=False))
            key_pos.append(torch.nn.functional.pad(row.state.key_positions[layer], (0, pad), value=_FAR))
            src_pos.append(torch.nn.functional.pad(row.state.source_positions[layer], (0, pad), value=_FAR))
        data.append((torch.stack(keys), torch.stack(values)))  # [row, kv_head, slot, head_dim]
        state.valid[layer] = torch.stack(valid)  # [row, kv_head, slot]
        state.key_positions[layer] = torch.stack(key_pos)
        state.source_positions[layer] = torch.stack(src_pos)
    return RowBatch(cache_from_tensors(data), state, list(built))


def forward_rows(model, batch: RowBatch, ids: torch.Tensor, positions: torch.Tensor, source_positions: torch.Tensor,
                 keep_logits: int = 1) -> torch.Tensor:
    """Feed ``ids`` ``[row, T]`` at ``positions`` ``[row, T]`` (long, or float64 for real-valued positions:
    :mod:`relaylens.generation.positions`); float32 logits ``[row, keep_logits or T, vocab]``."""
    state = batch.state
    state.new_positions = torch.cat((state.new_positions, positions), dim=-1)
    state.new_source_positions = torch.cat((state.new_source_positions, source_positions), dim=-1)
    for row, own in enumerate(state.row_states):  # what a sequential run of the row would have recorded
        own.new_positions = state.new_positions[row]
        own.new_source_positions = state.new_source_positions[row]
    device = model.device
    factors = (batch.factors if batch.factors is not None or not positions.is_floating_point()
               else RotaryFactors.from_model(model))
    with torch.no_grad(), attention_context(model, state), new_token_phases(model, factors, positions):
        out = model(input_ids=ids.to(device), position_ids=position_ids(positions).to(device), cache=batch.cache,
                    use_cache=True, logits_to_keep=keep_logits)
    return out.logits.float()


def _rewind(batch: RowBatch, tokens: int) -> None:
    """Forget the last ``tokens`` new tokens of every row (after a teacher-forced probe)."""
    crop_cache(batch.cache, tokens)
    state = batch.state
    state.new_positions = state.new_positions[:, :-tokens]
    state.new_source_positions = state.new_source_positions[:, :-tokens]


def _keep(batch: RowBatch, keep: list[int]) -> None:
    """Drop every row not in ``keep`` from the cache and the state (stopped rows cost nothing afterwards)."""
    index = torch.tensor(keep, dtype=torch.long)
    select_cache_rows(batch.cache, index)
    state = batch.state
    for table in (state.valid, state.key_positions, state.source_positions):
        for layer, tensor in table.items():
            table[layer] = tensor[index.to(tensor.device)]
    state.new_positions, state.new_source_positions = state.new_positions[index], state.new_source_positions[index]
    batch.layers = [batch.layers[i] for i in keep]


def run_rows(
    model,
    prefill: PrefillResult,
    rows: list[Row],
    question_ids: torch.Tensor,
    settings: DecodeSettings | None = None,
    *,
    keep_question_logits: bool = False,
    teacher_token: int | None = None,
    **options,
) -> list[GenerationResult]:
    """Question pass and greedy decoding of ``rows`` in one batch over ``prefill``; one result per row, in order.

    Arguments as in :func:`relaylens.generation.single.run_condition`; every row shares the question and ``settings``
    (:class:`~relaylens.generation.settings.DecodeSettings`; ``options``: its fields as loose keywords). Observers
    of a row see that row alone, as a sequential run shows it (``teacher_token``: fed at each row's next continuation
    position with the rows' ``teacher_observers`` active, then forgotten).
    """
    if not rows:
        raise ShapeError("run_rows needs at least one (selection, condition) row")
    settings = DecodeSettings.build(settings, **options)
    max_new_tokens, window_mode = settings.max_new_tokens, settings.window_mode
    factors = settings.factors or RotaryFactors.from_model(model)
    question_ids = torch.as_tensor(question_ids, dtype=torch.long).reshape(-1)
    if question_ids.numel() == 0:
        raise ShapeError("the question has no tokens; render the prompt with a question block")
    count, length = len(rows), question_ids.numel()
    built = []
    for row in rows:
        layers = relocate_selection(prefill, row.selection, row.condition, factors, window_mode)
        last = _start_tensor(layers.coordinates.question_start) + length - 1 + max(max_new_tokens, 0)
        label = str(layers.coordinates.condition)
        fix = ("Fix: use a smaller shift, a shorter history or fewer --max-new-tokens, or a model with a longer context"
               if "shift" in label else "Fix: use shorter records or fewer --max-new-tokens, or a model with a longer "
               "context (this condition has no shift to reduce)")
        factors.check_any_positions(last, f"condition {label}: question/generation positions", fix=fix)
        built.append(layers)
    starts = torch.cat([_start_tensor(layers.coordinates.question_start) for layers in built])  # [row]
    positions = starts[:, None] + torch.arange(length)  # [row, Q]
    source = (torch.arange(length) + prefill.history_length).expand(count, -1)  # [row, Q]
    batch = stack_rows(built, window_mode)
    batch.factors = factors
    del built
    state = batch.state
    state.row_states = [layers.state for layers in batch.layers]
    state.row_observers = [list(row.observers) for row in rows]
    ids, fed, fed_source = question_ids.expand(count, -1), positions, source
    if teacher_token is not None:  # fed right after the question in the same pass (see the module docstring)
        state.row_teacher_observers = [list(row.teacher_observers) for row in rows]
        ids = torch.cat((ids, torch.full((count, 1), int(teacher_token))), dim=-1)  # [row, Q + 1]
        fed, fed_source = torch.cat((fed, fed[:, -1:] + 1), dim=-1), torch.cat((fed_source, fed_source[:, -1:] + 1),
                                                                               dim=-1)
    keep_logits = 0 if keep_question_logits else 1 + (teacher_token is not None)
    logits = forward_rows(model, batch, ids, fed, fed_source, keep_logits)  # [row, Q or 1 (+ 1), vocab]
    state.row_observers, state.row_teacher_observers, state.row_states = [], [], []
    if teacher_token is not None:
        teacher_logits, logits = logits[:, -1], logits[:, :-1]  # [row, vocab], [row, Q or 1, vocab]
        _rewind(batch, 1)
    results = [GenerationResult(layers.coordinates.condition, layers.coordinates.question_start, positions[b],
                                logits[b, -1].clone(), question_logits=logits[b] if keep_question_logits else None)
               for b, layers in enumerate(batch.layers)]
    if teacher_token is not None:
        for result, row_logits in zip(results, teacher_logits):
            result.teacher_logits = row_logits
    tokenizer = settings.tokenizer
    if settings.eos_token_ids is None:
        settings = replace(settings, eos_token_ids=frozenset(default_eos_ids(model, tokenizer)))
    decode_rows(model, batch, results, logits[:, -1], positions[:, -1] + 1, source[:, -1] + 1, settings)
    if tokenizer is not None:
        for result in results:
            ids = [t for t in result.token_ids if t not in settings.eos_token_ids]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            result.text = text.strip().split("\n")[0].strip() if settings.stop_at_newline else text.strip()
    return results


def _start_tensor(question_start) -> torch.Tensor:
    """``[1]`` position tensor of a question start: long for an int, float64 for a real one (detached)."""
    if isinstance(question_start, torch.Tensor):
        return question_start.detach().to(torch.float64).reshape(1)
    return torch.tensor([question_start], dtype=torch.long if isinstance(question_start, int) else torch.float64)


def default_eos_ids(model, tokenizer=None) -> set[int]:
    """EOS ids from the generation config, the model config and the tokenizer."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        ids.update(value if isinstance(value, (list, tuple, set)) else [value])
    return {int(i) for i in ids}


def decode_rows(model, batch: RowBatch, results: list[GenerationResult], current: torch.Tensor,
                next_position: torch.Tensor, next_source: torch.Tensor, settings: DecodeSettings) -> None:
    """Greedy decoding of every row until it stops; ``current`` ``[row, vocab]`` holds each row's next-token logits.

    ``settings.decoding="static"`` decodes with :func:`relaylens.generation.static.decode_static` (integer positions;
    real-valued ones and a newline stop the host check disagrees with decode the dynamic way, from the same cache).
    """
    if settings.decoding == "static" and not next_position.is_floating_point():
        from relaylens.generation.static import decode_static  # noqa: PLC0415 - import cost: transformers' cache classes

        if decode_static(model, batch, results, current, next_position, next_source, settings):
            return
    for _ in decode_steps(model, batch, results, current, next_position, next_source, settings):
        pass


def decoding_path(model) -> dict:
    """What a decoding step of ``model`` runs, and why (the run manifest's ``config.decoding``): the linear layers
    (oneDNN-prepacked bfloat16, ``F.linear``, or copies in a decoding dtype of their own,
    :mod:`relaylens.model.packed`) and the attention of passes no probe observes (the fused kernel or relaylens's
    own, :data:`relaylens.generation.attention.FUSED_UNOBSERVED`).

    >>> from relaylens.testing import tiny_model
    >>> decoding_path(tiny_model("llama"))["linear_layers"]
    'F.linear'
    """
    linear_layers, why = decoding_linears(model)
    fused = attention_module.FUSED_UNOBSERVED
    return {"linear_layers": linear_layers, "linear_layers_why": why,
            "unobserved_attention": "fused (scaled_dot_product_attention; relaylens's own under attention "
                                    "softcapping)" if fused else "relaylens's own (FUSED_UNOBSERVED = False)"}


def decode_steps(model, batch: RowBatch, results: list[GenerationResult], current: torch.Tensor,
                 next_position: torch.Tensor, next_source: torch.Tensor, settings: DecodeSettings):
    """The dynamic path of :func:`decode_rows` one forward pass at a time: a generator that yields after each decoding
    step's forward (``settings.eos_token_ids``: None means no EOS stop here; :func:`run_rows` fills the model's).

    A caller can time each step, or interleave the steps of two requests (``relaylens bench overhead``).
    """
    max_new_tokens, tokenizer, stop_at_newline = settings.max_new_tokens, settings.tokenizer, settings.stop_at_newline
    eos = settings.eos_token_ids or frozenset()
    active = list(range(len(results)))  # result index of each batch row
    packs = pack_linears(model) if max_new_tokens > 1 else []  # built once per model, used inside each step
    for step in range(max_new_tokens):
        tokens = current.argmax(-1).tolist()  # [row]
        keep = []
        for b, index in enumerate(active):
            result, token = results[index], tokens[b]
            result.token_ids.append(token)
            if token in eos:
                result.stop_reason = "eos"
            elif stop_at_newline and tokenizer is not None and newline_stop(tokenizer, result.token_ids):
                result.stop_reason = "newline"
            elif step < max_new_tokens - 1:
                result.positions.append(next_position[b].item())  # int (float for real-valued positions)
                keep.append(b)
        if not keep:
            return
        if len(keep) < len(active):
            _keep(batch, keep)
            active = [active[b] for b in keep]
            next_position, next_source = next_position[keep], next_source[keep]
            tokens = [tokens[b] for b in keep]
        ids = torch.tensor(tokens, dtype=torch.long)[:, None]  # [row, 1]
        with packed_linears(packs):  # only for this step's forward: the caller may use the model between steps
            current = forward_rows(model, batch, ids, next_position[:, None], next_source[:, None])[:, -1]
        next_position, next_source = next_position + 1, next_source + 1
        yield step
