"""Attention-based selectors against brute-force references built from the full eager attention matrix.

A tiny random Llama (4 layers, 4 query heads, 2 kv heads; q/k projections scaled so attention is far from uniform)
runs a 96-token history once in eager mode with ``output_attentions=True``. The references below read those
``[q_head, L, L]`` matrices and apply the written definitions of ``reference/selectors.md`` with plain Python loops
and sorts; the selectors read a :class:`PrefillResult` (cached keys/values, window queries) built from the same
forward, plus column sums captured by :func:`capture_column_sums`.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama import modeling_llama

from relaylens.model.attention_stats import capture_column_sums
from relaylens.model.prefill import PrefillResult
from relaylens.selectors import H2O, AdaKV, CaM, ChunkKV, PyramidKV, SnapKV
from relaylens.testing import peaked_model

L, W, K = 96, 8, 24  # history, observation window, budget (states per layer and kv head)
GROUP = 2


@pytest.fixture(scope="module")
def run():
    """One eager forward: the PrefillResult (window = 32 queries captured) and the full attention per layer."""
    model = peaked_model(attn_implementation="eager", num_hidden_layers=4)
    ids = torch.randint(3, 384, (1, L), generator=torch.Generator().manual_seed(0))
    window_queries = {}

    def grab(i):
        def hook(module, args, kwargs):  # plain Llama math, independent of relaylens's query recipes
            h = kwargs["hidden_states"]  # [1, L, hidden]
            q = module.q_proj(h).view(1, L, -1, module.head_dim).transpose(1, 2)  # [1, q_head, L, d]
            cos, sin = kwargs["position_embeddings"]
            q, _ = modeling_llama.apply_rotary_pos_emb(q, q, cos, sin)
            window_queries[i] = q[0, :, -32:].detach().clone()  # [q_head, 32, d]

        return hook

    handles = [l.self_attn.register_forward_pre_hook(grab(i), with_kwargs=True) for i,
               l in enumerate(model.model.layers)]
    try:
        with torch.no_grad(), capture_column_sums(model, block_size=10) as stats:
            out = model(ids, use_cache=True, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    cache = out.past_key_values
    pre = PrefillResult(
        history_ids=ids[0],
        keys=[layer.keys[0] for layer in cache.layers],  # per layer [kv_head, L, d]
        values=[layer.values[0] for layer in cache.layers],
        window_queries=[window_queries[i] for i in range(len(cache.layers))],  # per layer [q_head, 32, d]
        window_size=32,
        scaling=model.model.layers[0].self_attn.scaling,
        num_key_value_groups=GROUP,
        column_sums=stats.column_sums,
    )
    attentions = [a[0].double() for a in out.attentions]  # per layer [q_head, L, L]
    return pre, attentions


# -------------------------------------------------------------------------------------------------------------
# brute-force references (lists and loops)
def ref_topk(scores: list[float], k: int) -> list[int]:
    """Top-k indices, ties to the later index, sorted ascending."""
    return sorted(sorted(range(len(scores)), key=lambda j: (-scores[j], -j))[:k])


def ref_window_scores(att: torch.Tensor, w: int, kernel: int = 7) -> list[list[float]]:
    """selectors.md §1 from the full matrix: window-row sums over prefix columns, GQA mean, max-pool (-inf pad)."""
    heads = att.shape[0] // GROUP
    out = []
    for h in range(heads):
        s = [
            sum(float(att[h * GROUP + r, i, j]) for r in range(GROUP) for i in range(L - w, L)) / GROUP
            for j in range(L - w)
        ]
        out.append([max(s[max(0, j - kernel // 2) : j + kernel // 2 + 1]) for j in range(L - w)])
    return out


def ref_window_raw(att: torch.Tensor, w: int) -> list[list[float]]:
    """Unpooled GQA-mean window sums over every column (CaM's A)."""
    heads = att.shape[0] // GROUP
    return [[float(att[h * GROUP : (h + 1) * GROUP, L - w :, j].sum()) / GROUP for j in range(L)] for h in range(heads)]


def kept(sel, layer, head) -> list[int]:
    return sel.positions[layer, head][sel.valid[layer, head]].tolist()


def window(w: int) -> list[int]:
    return list(range(L - w, L))


def ref_largest_remainder(targets: list[float], total: int) -> list[int]:
    base = [int(t + 1e-9) for t in targets]
    order = sorted(range(len(targets)), key=lambda i: (-(targets[i] - base[i]), i))
    for i in order[: total - sum(base)]:
        base[i] += 1
    return base


# -------------------------------------------------------------------------------------------------------------
def test_capture_window_queries_match_eager(run):
    """Sanity of the fixture itself: softmax of the captured queries over the cached keys = eager rows."""
    pre, att = run
    for l in range(pre.num_layers):
        q = pre.window_queries[l].double()  # [q_head, 32, d]
        k = pre.keys[l].double().repeat_interleave(GROUP, 0)  # [q_head, L, d]
        logits = q @ k.transpose(1, 2) * pre.scaling
        rows = torch.arange(L - 32, L)[:, None]
        probs = logits.masked_fill(torch.arange(L)[None] > rows, float("-inf")).softmax(-1)
        torch.testing.assert_close(probs, att[l][:, L - 32 :], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("w", [W, 32])
def test_snapkv_equals_bruteforce(run, w):
    pre, att = run
    sel = SnapKV(window=w).select(pre, None, K if w == W else 40)
    k = K if w == W else 40
    for l in range(pre.num_layers):
        ref = ref_window_scores(att[l], w)
        for h in range(pre.num_kv_heads):
            assert kept(sel, l, h) == ref_topk(ref[h], k - w) + window(w), (l, h)
            prefix = sel.valid[l, h] & (sel.positions[l, h] < L - w)
            got_scores = sel.scores[l, h][prefix].double()
            want = torch.tensor([ref[h][j] for j in kept(sel, l, h)[: k - w]], dtype=torch.float64)
            torch.testing.assert_close(got_scores, want, atol=1e-6, rtol=1e-5)
    assert (sel.counts == k).all()


def test_snapkv_wrong_definitions_would_fail(run):
    """The reference discriminates: dropping the window keys from the softmax or avg-pooling changes the sets."""
    pre, att = run
    sel = SnapKV(window=W).select(pre, None, K)
    other = SnapKV(window=W, pooling="avg").select(pre, None, K)
    assert not torch.equal(sel.positions, other.positions)
    renorm = [a[:, :, : L - W] / a[:, :, : L - W].sum(-1, keepdim=True) for a in att]  # window keys dropped
    differs = any(
        kept(sel, l, h) != ref_topk(ref_window_scores(renorm[l], W)[h], K - W) + window(W)
        for l in range(pre.num_layers)
        for h in range(pre.num_kv_heads)
    )
    assert differs


def test_pyramidkv_equals_bruteforce(run):
    pre, att = run
    n, b = pre.num_layers, K - W
    sel = PyramidKV(window=W).select(pre, None, K)
    low = b / 20
    high = 2 * b - low
    if high >= L - W:
        high, low = L - W, 2 * b - (L - W)
    caps = ref_largest_remainder([high - l * (high - low) / (n - 1) for l in range(n)], n * b)
    for l in range(n):
        ref = ref_window_scores(att[l], W)
        for h in range(pre.num_kv_heads):
            assert kept(sel, l, h) == ref_topk(ref[h], caps[l]) + window(W), (l, h)
    assert sel.counts[:, 0].tolist() == [c + W for c in caps]
    assert int(sel.counts.sum()) == n * pre.num_kv_heads * K
    assert len(set(sel.counts[:, 0].tolist())) == n  # a real pyramid, not a silent SnapKV fallback


@pytest.mark.parametrize("alpha", [0.2, 0.0])
def test_adakv_equals_bruteforce(run, alpha):
    pre, att = run
    b, heads = K - W, pre.num_kv_heads
    sel = AdaKV(window=W, floor_alpha=alpha).select(pre, None, K)
    for l in range(pre.num_layers):
        ref = ref_window_scores(att[l], W)
        flat = [s for h in range(heads) for s in ref[h]]
        top = sorted(range(len(flat)), key=lambda i: (-flat[i], -i))[: heads * b]
        counts = [sum(1 for i in top if i // (L - W) == h) for h in range(heads)]
        caps = ref_largest_remainder([(1 - alpha) * c + alpha * b for c in counts], heads * b)
        for h in range(heads):
            assert kept(sel, l, h) == ref_topk(ref[h], caps[h]) + window(W), (l, h)
        assert int(sel.counts[l].sum()) == heads * K
    assert len(set(sel.counts.flatten().tolist())) > 1  # per-head budgets really differ


def test_chunkkv_equals_bruteforce(run):
    pre, att = run
    c = 10
    sel = ChunkKV(window=W, chunk_size=c).select(pre, None, K)
    for l in range(pre.num_layers):
        ref = ref_window_scores(att[l], W)
        token = [sum(ref[h][j] for h in range(pre.num_kv_heads)) for j in range(L - W)]
        chunks = [list(range(s, min(s + c, L - W))) for s in range(0, L - W, c)]
        means = [sum(token[j] for j in ch) / len(ch) for ch in chunks]
        chosen, used = [], 0
        for i in sorted(range(len(chunks)), key=lambda i: (-means[i], -i)):
            if used + len(chunks[i]) <= K - W:
                chosen.append(i)
                used += len(chunks[i])
        want = sorted(j for i in chosen for j in chunks[i]) + window(W)
        for h in range(pre.num_kv_heads):
            assert kept(sel, l, h) == want, (l, h)


def test_chunkkv_layer_reuse(run):
    pre, _ = run
    plain = ChunkKV(window=W).select(pre, None, K)
    reuse = ChunkKV(window=W, reuse_layers=2).select(pre, None, K)
    assert torch.equal(reuse.positions[0], plain.positions[0]) and torch.equal(reuse.positions[2], plain.positions[2])
    assert torch.equal(reuse.positions[1], reuse.positions[0]) and torch.equal(reuse.positions[3], reuse.positions[2])
    assert reuse.info["index_source_layer"] == [0, 0, 2, 2]


def test_column_sums_equal_eager(run):
    pre, att = run
    for l in range(pre.num_layers):
        torch.testing.assert_close(pre.column_sums[l].double(), att[l].sum(1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("normalize", [False, True])
def test_h2o_equals_bruteforce(run, normalize):
    pre, att = run
    sel = H2O(normalize=normalize).select(pre, None, K)
    r = K // 2
    for l in range(pre.num_layers):
        for h in range(pre.num_kv_heads):
            col = [float(att[l][h * GROUP : (h + 1) * GROUP, :, j].sum()) / GROUP for j in range(L)]
            if normalize:
                col = [col[j] / (L - j) for j in range(L)]
            assert kept(sel, l, h) == ref_topk(col[: L - r], K - r) + list(range(L - r, L)), (l, h)
    assert sel.info["recent"] == r and (sel.counts == K).all()
    if not normalize:
        assert not torch.equal(sel.positions, H2O(normalize=True).select(pre, None, K).positions)


@pytest.mark.parametrize("merge_limit", [None, 10])
def test_cam_equals_bruteforce(run, merge_limit):
    pre, att = run
    m, seed = 4, 3
    sel = CaM(window=W, merge_size=m, seed=seed, merge_limit=merge_limit).select(pre, None, K)
    gen = torch.Generator().manual_seed(seed)
    for l in range(pre.num_layers):
        ref, a = ref_window_scores(att[l], W), ref_window_raw(att[l], W)
        for h in range(pre.num_kv_heads):
            keep = ref_topk(ref[h], K - W) + window(W)
            assert kept(sel, l, h) == keep
            evicted = [j for j in range(L - W) if j not in keep]
            if merge_limit is not None:
                evicted = ref_topk([ref[h][e] for e in evicted], merge_limit)
                evicted = [[j for j in range(L - W) if j not in keep][i] for i in evicted]
            u = torch.rand(len(evicted), generator=gen).tolist()
            v = pre.values[l][h].double().clone()  # [L, d]
            merged = {t: v[t].clone() for t in keep}
            for e, ue in zip(evicted, u):
                targets = [t for t in keep if t > e][:m]
                if not targets:
                    continue
                p = a[h][e] / (sum(a[h][t] for t in targets) / len(targets))
                if ue < min(max(p, 0.0), 1.0):
                    for t in targets:
                        merged[t] += v[e] / len(targets)
            want = torch.stack([merged[t] for t in keep]).float()
            torch.testing.assert_close(sel.values[l, h], want, atol=1e-5, rtol=1e-5)
    # keys/positions untouched: same kept set as SnapKV; values really changed
    assert torch.equal(sel.positions, SnapKV(window=W).select(pre, None, K).positions)
    original = torch.stack([torch.stack([pre.values[l][h][sel.positions[l, h]] for h in range(2)]) for l in range(4)])
    assert not torch.allclose(sel.values, original)
    assert sel.info["value_norm_ratio"] > 1.0 and sel.info["merged_states"] > 0


def test_cam_merge_limit_bounds_value_inflation(run):
    pre, _ = run
    full = CaM(window=W, merge_size=4).select(pre, None, K)
    limited = CaM(window=W, merge_size=4, merge_limit=5).select(pre, None, K)
    none = CaM(window=W, merge_size=4, merge_limit=0).select(pre, None, K)
    assert none.info["value_norm_ratio"] == pytest.approx(1.0) and none.info["merged_states"] == 0
    assert limited.info["merged_states"] <= 5 * pre.num_layers * pre.num_kv_heads < full.info["merged_states"]


def test_cam_column_sum_attention(run):
    pre, _ = run
    a = CaM(window=W, attention="column_sums").select(pre, None, K)
    b = CaM(window=W).select(pre, None, K)
    assert torch.equal(a.positions, b.positions) and not torch.equal(a.values, b.values)


def test_pool_per_query_head_changes_maxpool_order(run):
    pre, _ = run
    a = SnapKV(window=W).scorer.scores(pre)
    b = SnapKV(window=W, pool_per_query_head=True).scorer.scores(pre)
    assert not torch.allclose(a, b)
    assert (b >= a - 1e-7).all()  # mean of maxes >= max of means


def test_selectors_on_prefill_history_match_eager_fixture(run):
    """The real pipeline (sdpa prefill, rebuilt window queries) selects exactly what the eager fixture selects."""
    from relaylens.model.prefill import prefill_history

    pre_eager, _ = run
    model = peaked_model(num_hidden_layers=4)
    pre = prefill_history(model, pre_eager.history_ids, window_size=32)
    for selector in (SnapKV(window=W), AdaKV(window=32), PyramidKV(window=W), ChunkKV(window=W)):
        a, b = selector.select(pre, None, 40), selector.select(pre_eager, None, 40)
        assert torch.equal(a.positions, b.positions), selector.name
