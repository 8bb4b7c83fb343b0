"""``relaylens model check NAME``: exactness checks on a real model, for models too slow to pull in CI (Gemma-3).

The test suite runs the same checks on tiny random configs of every architecture and on the embedded SmolLM2; this
command repeats them on any loadable model and prints the numbers:

* keep-everything + ``original`` vs a plain full forward over history + question (max abs logit difference);
* keep-everything + ``relay`` vs keep-everything + ``original`` (nothing to compact: must agree);
* relocated keys vs the model rotating the captured pre-rotary keys directly at the target positions;
* relocated keys vs the keys the model itself caches when the whole history runs at shifted positions (``p + k``):
  an independent reference that also catches layers without positional encoding (NoPE), whose keys must not move
  (16-bit models: thresholded at layer 0, and all layers against the measured rounding of the shifted forward);
* the same two comparisons at the far end of the rotary range (keys moved to end at ``min(131,000, max positions
  - 1)``; with ``--rope-scaling yarn:4:32768 --max-position 131072`` that is position 131,000, YaRN amplitude
  included): threshold 1e-5 of the largest key for float32 models;
* for sliding-window models, how many retained states each sliding layer sees under ``original`` and ``relay``.

Each exactness check has a threshold (:data:`THRESHOLDS`, relative to the magnitude of what is compared, looser for
16-bit models); :func:`verdicts` marks each one pass or fail, and ``relaylens model check`` exits 1 when any fails.

Example:
    $ relaylens model check gemma3-270m --history-tokens 700
"""

from __future__ import annotations

import torch

from relaylens.datasets import bundled_sample_path, load_records
from relaylens.datasets.prompting import render_prompt
from relaylens.geometry.rotary import RotaryFactors, relocate_keys
from relaylens.geometry.selection import Selection
from relaylens.model.hf import (
    attention_kernel,
    attention_kernel_name,
    attention_modules,
    attention_window,
    cache_lengths,
    cached_keys,
    call_rotary,
    find_rotary_embedding,
    new_cache,
    pre_rotary_keys,
    rotary_function,
)
from relaylens.model.prefill import prefill_history
from relaylens.probes.readouts import FinalTokenRecorder

#: Relative error allowed per check name prefix, for float32 models and for 16-bit models.
THRESHOLDS = {"keep-all": (1e-4, 2e-2), "relocated keys up to position": (1e-5, 2e-2), "relocated keys": (1e-4, 2e-2)}
SHIFT = 1000  # positions added for the shifted-forward reference
FAR = 131_000  # the far-end check moves keys to end here (or at the model's last position, when smaller)


def verdicts(results: list[tuple[str, float]],
             dtype: torch.dtype = torch.float32) -> list[tuple[str, float, float | None, bool]]:
    """``(name, value, threshold or None, passed)`` for each check result; informational lines always pass.

    >>> [ok for *_, ok in verdicts([("keep-all relay vs keep-all original, relative", 3e-6),
    ...                             ("relocated keys vs the model's own keys at p + 1000, relative", 0.93)])]
    [True, False]
    """
    wide = dtype == torch.float32 or dtype == torch.float64
    kernel = max((v for n, v in results if n.startswith("tolerance:")), default=0.0)  # two kernels disagree this much
    shifted = max((v for n, v in results if n.startswith("shift tolerance:")), default=0.0)  # the shifted forward's
    out = []
    for name, value in results:
        limit = next(((a if wide else b) for prefix, (a, b) in THRESHOLDS.items() if name.startswith(prefix)), None)
        if limit is not None and name.startswith("keep-all") and not wide:
            limit = max(limit, 2 * kernel)
        if limit is not None and "all layers (inputs rounded" in name:  # measured like keep-all's (16-bit only)
            limit = max(limit, 2 * shifted)
        out.append((name, value, limit, limit is None or value <= limit))
    return out


def shifted_keys(model, ids: torch.Tensor, shift: int) -> list[torch.Tensor]:
    """Per layer ``[1, kv_head, T, head_dim]``: the keys the model caches for ``ids`` at positions ``shift..``."""
    positions = torch.arange(ids.numel(), device=ids.device)[None] + shift  # [1, T]
    cache = new_cache()
    with torch.no_grad():
        model(ids[None], position_ids=positions, use_cache=True, cache=cache)
    return [cached_keys(cache, layer) for layer in range(len(cache_lengths(cache)))]


def run_checks(model, tokenizer, history_tokens: int = 700, keep_every: int = 5) -> list[tuple[str, float]]:
    """The checks above on the first bundled record, history cut to ``history_tokens``; returns ``(name, value)``."""
    from relaylens.generation.single import build_cache, run_condition  # noqa: PLC0415 - import cost: transformers loads on first use

    prompt = render_prompt(load_records(bundled_sample_path())[0], tokenizer, mode="completion")
    history, question = prompt.history_ids[:history_tokens], prompt.question_ids
    factors = RotaryFactors.from_model(model)
    prefill = prefill_history(model, history, capture_window_queries=False)
    full = Selection.full(prefill.history_length, prefill.num_layers, prefill.num_kv_heads)
    results = []
    original = run_condition(model, prefill, full, "original", question, max_new_tokens=0, factors=factors,
                             keep_question_logits=True)
    device = next(model.parameters()).device
    full_ids = torch.cat((history, question))[None].to(device)  # [1, L + Q]
    with torch.no_grad():
        reference = model(full_ids).logits[0, history.numel():].float()
    scale = float(reference.abs().max())
    keep_all = float((original.question_logits.to(reference.device) - reference).abs().max())
    results.append(("keep-all original vs full forward, max |logit diff| / max |logit|", keep_all / scale))
    if model.dtype != torch.float32:  # the tolerance of a reduced-precision forward: two kernels on the same input
        before = attention_kernel_name(model)
        other_name = "eager" if before != "eager" else "sdpa"
        with attention_kernel(model, other_name), torch.no_grad():
            other = model(full_ids).logits[0, history.numel():].float()
        results.append((f"tolerance: plain {str(model.dtype).removeprefix('torch.')} forward, {before} vs {other_name} "
                        "kernel, max |logit diff| / max |logit|", float((other - reference).abs().max()) / scale))
    relay = run_condition(model, prefill, full, "relay", question, max_new_tokens=0, factors=factors,
                          keep_question_logits=True)
    results.append(("keep-all relay vs keep-all original, max |logit diff| / max |logit|",
                    float((relay.question_logits - original.question_logits).abs().max()) / scale))
    results.append((f"layers without positional encoding (NoPE), left unmoved: {sorted(factors.nope_layers) or 'none'}",
                    float(len(factors.nope_layers))))

    kept = list(range(0, prefill.history_length, keep_every))
    sparse = Selection.from_lists([[kept] * prefill.num_kv_heads] * prefill.num_layers, prefill.history_length)
    relocated = build_cache(prefill, sparse, "relay", factors)
    pre_keys = pre_rotary_keys(model, history)
    far = min(FAR, factors.max_position - 1) if factors.max_position else FAR
    far_targets = torch.arange(far - len(kept) + 1, far + 1)  # [slot] the kept keys moved to end at `far`
    for label, moved_keys in (("p'", lambda layer: cached_keys(relocated.cache, layer)[0]),
                              (f"up to position {far:,}", lambda layer: _relocated_far(prefill, kept, far_targets,
                                                                                     factors, layer))):
        targets = None if label == "p'" else far_targets
        worst, worst_ulp = _against_direct_rotation(model, factors, relocated, pre_keys, kept, moved_keys, targets)
        name = ("relocated keys vs direct rotation at p'" if targets is None
                else f"relocated keys {label} vs direct rotation")
        results.append((f"{name}, max |diff| / max |key|", worst))
        if model.dtype != torch.float32:
            results.append((f"ulps: {name} rounded to {model.dtype}, max at plane magnitude", worst_ulp))


    source = torch.arange(prefill.history_length)
    own = shifted_keys(model, history.to(device), SHIFT)
    shifted = []
    for layer in range(prefill.num_layers):
        moved = relocate_keys(prefill.keys[layer], source, source + SHIFT, factors,
                              layer=layer if factors.per_layer else None)
        reference_keys = own[layer].reshape(moved.shape).to(moved.device).float()
        shifted.append(float((moved.float() - reference_keys).abs().max() / reference_keys.abs().max()))
    results.extend(_shifted_results(model, history.to(device), own, shifted))
    shift = far - (prefill.history_length - 1)  # the history's last key lands on `far`
    if shift > 0:
        own = shifted_keys(model, history.to(device), shift)
        per_layer = []
        for layer in range(prefill.num_layers):
            moved = relocate_keys(prefill.keys[layer], source, source + shift, factors,
                                  layer=layer if factors.per_layer else None)
            reference_keys = own[layer].reshape(moved.shape).to(moved.device).float()
            per_layer.append(float((moved.float() - reference_keys).abs().max() / reference_keys.abs().max()))
        # layer 0 computes its keys from the embeddings alone: the same content at any position, so relocation must
        # match to rotation rounding; deeper layers also carry the attention's own float32 phase rounding at ~1e5
        results.append((f"relocated keys up to position {far:,} vs the model's own keys at p + {shift:,}, layer 0, "
                        "max |diff| / max |key|", per_layer[0]))
        results.append((f"(deeper layers: their inputs differ by the forward's own rounding at positions near {far:,}) "
                        "relocated vs the model's own keys, all layers, max |diff| / max |key|", max(per_layer)))

    windows = {i: attention_window(attn) for i, attn in enumerate(attention_modules(model))}
    sliding = [i for i, w in windows.items() if w]
    if sliding:
        for condition in ("original", "relay"):
            recorder = FinalTokenRecorder()
            run_condition(model, prefill, sparse, condition, question, max_new_tokens=0, factors=factors,
                          observers=[recorder])
            visible = visible_states(recorder, sliding)
            results.append((f"{condition}: retained states visible to the final token in sliding layers (mean)",
                            visible))
    return results


def _shifted_results(model, history: torch.Tensor, own: list[torch.Tensor], shifted: list[float]):
    """The shifted-forward comparison (relocated keys vs the model's own keys at ``p + SHIFT``, per layer ``shifted``).

    float32: one thresholded line over all layers. 16-bit: a layer's keys beyond layer 0 come from inputs that differ
    by the forward's own rounding at the shifted positions (0.023 in bfloat16 on an H200, issue 51), which says
    nothing about the relocation. So the thresholded line is **layer 0** (keys from the embeddings alone: the same
    content at any position, so they match to rotation rounding, and a wrong relocation misses by O(1)); all layers
    are shown beside the **measured** rounding of that forward (the same shifted forward through another attention
    kernel), and checked against ``max(threshold, 2 x measured)`` as keep-all is."""
    name = f"relocated keys vs the model's own keys at p + {SHIFT}"
    if model.dtype in (torch.float32, torch.float64):
        return [(f"{name}, max |diff| / max |key|", max(shifted))]
    before = attention_kernel_name(model)
    other_name = "eager" if before != "eager" else "sdpa"
    with attention_kernel(model, other_name):
        other = shifted_keys(model, history, SHIFT)
    noise = max(float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in zip(other, own))
    dtype = str(model.dtype).removeprefix("torch.")
    return [(f"{name}, layer 0, max |diff| / max |key|", shifted[0]),
            (f"shift tolerance: the model's own {dtype} keys at p + {SHIFT}, {before} vs {other_name} kernel, all "
             "layers, max |diff| / max |key|", noise),
            (f"{name}, all layers (inputs rounded by the {dtype} forward), max |diff| / max |key|", max(shifted))]


def _relocated_far(prefill, kept: list[int], targets: torch.Tensor, factors, layer: int) -> torch.Tensor:
    """``[kv_head, slot, head_dim]``: the kept keys of ``layer`` relocated by relaylens to ``targets``."""
    keys = prefill.keys[layer][:, kept]  # [kv_head, slot, head_dim]
    source = torch.tensor(kept)
    return relocate_keys(keys, source, targets, factors, layer=layer if factors.per_layer else None)


def _against_direct_rotation(model, factors, relocated, pre_keys, kept, moved_keys, targets) -> tuple[float, float]:
    """Largest relative error (and, for 16-bit models, plane ulps) of relaylens's relocated keys against the model's
    own rotary applied in float32 to the captured pre-rotary content at the target positions (``targets``, or the
    relay condition's compact positions when None)."""
    device = next(model.parameters()).device
    apply = rotary_function(attention_modules(model)[0])
    rotary = find_rotary_embedding(model)
    worst, worst_ulp = 0.0, 0.0
    for layer in range(len(pre_keys)):
        target = relocated.coordinates.key_positions[layer, 0] if targets is None else targets
        cos, sin = call_rotary(rotary, target[None].to(device), factors.layer_types[layer])
        content = pre_keys[layer][:, :, kept]
        _, direct = apply(content.float(), content.float(), cos.float(), sin.float())  # float32 rotation of the content
        if layer in factors.nope_layers:
            direct = content.float()  # the model applies no rotary in this layer
        moved = moved_keys(layer)[None].float()
        worst = max(worst, float((moved - direct.to(moved.dtype)).abs().max() / direct.abs().max()))
        if model.dtype != torch.float32:  # in units of the cache dtype's spacing at each plane's magnitude
            worst_ulp = max(worst_ulp, _plane_ulps(moved, direct.to(model.dtype).float(), factors, model.dtype))
    return worst, worst_ulp


def _plane_ulps(moved: torch.Tensor, direct: torch.Tensor, factors, dtype: torch.dtype) -> float:
    """Largest ``|moved - direct|`` over the rotary features, in units of ``dtype``'s spacing at the magnitude of the
    plane (pair of features) the feature belongs to: a rotation mixes the two features of a plane, so a small
    feature's own spacing is not the scale of its rounding error."""
    rot = factors.rotary_dim
    d = direct[..., :rot]  # [..., rotary_dim]
    if factors.layout == "split_half":
        half = rot // 2
        radius = torch.sqrt(d[..., :half] ** 2 + d[..., half:] ** 2)
        radius = torch.cat((radius, radius), dim=-1)
    else:
        radius = torch.sqrt(d[..., 0::2] ** 2 + d[..., 1::2] ** 2).repeat_interleave(2, dim=-1)
    eps = torch.finfo(dtype).eps  # spacing at 1.0 (2^-7 for bfloat16)
    spacing = torch.pow(2.0, torch.floor(torch.log2(radius.clamp_min(torch.finfo(dtype).tiny)))) * eps
    return float(((moved[..., :rot] - d).abs() / spacing).max())


def visible_states(recorder, layers: list[int]) -> float:
    """Mean number of retained history states with non-zero weight in the given layers' final-token rows."""
    counts = [float((recorder.rows[layer][:, : recorder.widths[layer]] > 0).sum(-1).float().mean()) for layer in layers]
    return sum(counts) / len(counts)
