"""FINCH against a brute-force reference of its written definition, and its coordinates.

The reference runs the tiny Llama once in eager mode over ``history + question`` with ``output_attentions=True`` and
reads the question rows of the ``[q_head, L+Q, L+Q]`` matrices with Python loops: weight ``L + r`` per row, mean over
rows and over the query heads of a kv head, chunks from position 0 with largest-remainder quotas, top-k per chunk
(ties to the later position). FINCH itself gets its scores from a relaylens question pass over a
:func:`prefill_history` cache.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch
from transformers.models.llama import modeling_llama

from relaylens.conditions.scoped import get_condition
from relaylens.errors import RelaylensError, ShapeError
from relaylens.generation.single import build_cache, run_condition
from relaylens.geometry.rotary import RotaryFactors
from relaylens.model.prefill import prefill_history
from relaylens.selectors import REGISTRY, Finch, make_selector
from relaylens.selectors.finch import FINCH_COORDINATES, QuestionAttention, chunk_quotas
from relaylens.selectors.synthetic import random_prefill
from relaylens.testing import peaked_model

L, Q, GROUP = 72, 6, 2


@pytest.fixture(scope="module")
def run():
    model = peaked_model("llama", num_hidden_layers=3)
    gen = torch.Generator().manual_seed(7)
    history, question = torch.randint(3, 384, (L,), generator=gen), torch.randint(3, 384, (Q,), generator=gen)
    pre = prefill_history(model, history, window_size=8)
    prepared = Finch().prepare(model, pre, SimpleNamespace(question_ids=question))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(torch.cat([history, question])[None], output_attentions=True, use_cache=False)
    model.set_attn_implementation("sdpa")
    # attentions: per layer [q_head, L+Q, L+Q]
    return model, pre, question, [a[0].double() for a in out.attentions], prepared


def ref_quotas(chunk: int | None, k: int) -> list[tuple[int, int, int]]:
    size = chunk or L
    bounds = [(a, min(a + size, L)) for a in range(0, L, size)]
    exact = [Fraction(k * (b - a), L) for a, b in bounds]
    base = [int(e) for e in exact]
    order = sorted(range(len(bounds)), key=lambda i: (-(exact[i] - base[i]), i))
    for i in order[: k - sum(base)]:
        base[i] += 1
    return [(a, b, q) for (a, b), q in zip(bounds, base)]


def reference(att: torch.Tensor, k: int, chunk: int | None, normalize: bool) -> list[list[int]]:
    kept = []
    for h in range(att.shape[0] // GROUP):
        score = []
        for j in range(L):
            total = 0.0
            for q in range(h * GROUP, (h + 1) * GROUP):
                total += sum(float(att[q, L + r, j]) * ((L + r) if normalize else 1) for r in range(Q)) / Q
            score.append(total / GROUP)
        chosen = []
        for a, b, kc in ref_quotas(chunk, k):
            chosen += sorted(range(a, b), key=lambda j: (-score[j], -j))[:kc]
        kept.append(sorted(chosen))
    return kept


@pytest.mark.parametrize("chunk", [None, 16, 25])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("k", [18, 7])
def test_finch_equals_bruteforce(run, chunk, normalize, k):
    _, pre, _, att, prepared = run
    sel = replace(prepared, chunk_size=chunk, normalize=normalize).select(pre, None, k)
    for l in range(pre.num_layers):
        want = reference(att[l], k, chunk, normalize)
        for h in range(pre.num_kv_heads):
            assert sel.positions[l, h][sel.valid[l, h]].tolist() == want[h], (l, h)
    assert (sel.counts == k).all()
    assert sel.info["coordinates"] == "rank_sync" and sel.info["chunks"] == len(ref_quotas(chunk, k))


def test_question_attention_equals_eager_rows(run):
    _, pre, _, att, prepared = run
    for l in range(pre.num_layers):
        rows = att[l][:, L:, :L]  # [q_head, Q, L]
        want = (rows * (L + torch.arange(Q, dtype=torch.float64))[None, :, None]).mean(1)
        torch.testing.assert_close(prepared.question_attention.weighted[l].double(), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(prepared.question_attention.plain[l].double(), rows.mean(1), atol=1e-6, rtol=1e-5)


def test_chunking_and_normalisation_matter(run):
    """The reference discriminates: other chunkings / no normalisation keep other states."""
    _, pre, _, _, prepared = run
    base = replace(prepared, chunk_size=16).select(pre, None, 18).positions
    assert not torch.equal(base, replace(prepared, chunk_size=None).select(pre, None, 18).positions)
    # row weights L + r vary by under 10% over a 6-token question: the sets differ only at some budgets
    assert any(not torch.equal(replace(prepared, chunk_size=None).select(pre, None, k).positions,
                               replace(prepared, chunk_size=None, normalize=False).select(pre, None, k).positions)
               for k in range(4, 60))
    assert not (base == base[:, :1]).all()  # per-head sets


def test_coordinates_are_compact(run):
    """FINCH's coordinates: kept states at 0..K-1 in source order, question from K; identical to relay here."""
    model, pre, question, _, prepared = run
    k = 18
    sel = replace(prepared, chunk_size=16).select(pre, None, k)
    assert Finch.coordinates == FINCH_COORDINATES == "rank_sync"
    coords = get_condition(sel.info["coordinates"]).coordinates(sel)
    assert coords.question_start == k
    assert (coords.key_positions == torch.arange(k)).all()
    relay = get_condition("relay").coordinates(sel)
    assert torch.equal(relay.key_positions, coords.key_positions) and relay.question_start == coords.question_start
    result = run_condition(model, pre, sel, sel.info["coordinates"], question, max_new_tokens=2)
    assert result.question_positions.tolist() == list(range(k, k + Q))
    assert result.positions[:1] == ([k + Q] if len(result.token_ids) > 1 else [])


def test_cached_keys_sit_at_compact_positions(run):
    """Independent of relaylens's rotary code: the cache's keys are transformers' RoPE at 0..K-1 of the pre-rotary
    keys of the kept source tokens."""
    model, pre, _, _, prepared = run
    k = 12
    sel = replace(prepared, chunk_size=None).select(pre, None, k)
    relocated = build_cache(pre, sel, "rank_sync", RotaryFactors.from_model(model))
    pre_rotary = {}

    def grab(i):
        def hook(module, args, kwargs):
            h = kwargs["hidden_states"]  # [1, L, hidden]
            pre_rotary[i] = module.k_proj(h).view(1, L, -1, module.head_dim).transpose(1, 2)[0]  # [kv_head, L, d]
        return hook

    handles = [layer.self_attn.register_forward_pre_hook(grab(i), with_kwargs=True) for i,
               layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            model(pre.history_ids[None], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    cos, sin = model.model.rotary_emb(pre.keys[0][None], torch.arange(k)[None])  # positions 0..K-1
    for l in range(pre.num_layers):
        for h in range(pre.num_kv_heads):
            src = sel.positions[l, h]
            raw = pre_rotary[l][h, src][None, None]  # [1, 1, K, d]
            want, _ = modeling_llama.apply_rotary_pos_emb(raw, raw, cos, sin)
            torch.testing.assert_close(relocated.cache.layers[l].keys[0, h], want[0, 0], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length,chunk,k", [(10, 4, 5), (100, 30, 10), (97, 512, 9), (64, 1, 16), (50, 7, 50)])
def test_quotas_sum_to_the_budget(length, chunk, k):
    quotas = chunk_quotas(length, chunk, k)
    assert sum(q for _, _, q in quotas) == k
    assert all(0 <= q <= b - a for a, b, q in quotas)
    assert quotas[0][0] == 0 and quotas[-1][1] == length


def test_budget_exact_on_synthetic_prefill():
    pre = random_prefill(length=97, num_layers=2, num_kv_heads=3)
    captured = QuestionAttention([torch.rand(6, 97) for _ in range(2)], [torch.rand(6, 97) for _ in range(2)])
    for budget, want in ((0.1, 9), (0.5, 48), (97, 97), ("B20", 20)):
        assert (Finch(chunk_size=10, question_attention=captured).select(pre, None, budget).counts == want).all()
    with pytest.raises(ShapeError, match="same record"):
        Finch(question_attention=captured).select(random_prefill(length=50, num_kv_heads=3), None, 0.5)


def test_registered_and_bad_input():
    assert REGISTRY["finch"] is Finch and make_selector("finch", chunk_size=None).chunk_size is None
    for bad in ({"chunk_size": 0}, {"chunk_size": 2.5}, {"normalize": "yes"}, {"gqa_reduction": "min"}):
        with pytest.raises(RelaylensError):
            Finch(**bad)
    assert Finch() == Finch(question_attention=QuestionAttention([], []))  # captured data is not a hyperparameter
    with pytest.raises(ShapeError, match="Finch.prepare"):
        Finch().select(random_prefill(length=40), None, 0.5)
    with pytest.raises(RelaylensError, match="rendered prompt"):
        Finch().prepare(None, random_prefill(length=40), None)
