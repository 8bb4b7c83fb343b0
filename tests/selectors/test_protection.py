"""Protected spans (--protect-instructions): every registered selector keeps the instruction/template states, and the
budget ratio applies to the source tokens only (exact counts)."""

from __future__ import annotations

import math

import pytest
import torch

from relaylens.datasets.spans import RenderedPrompt, Span
from relaylens.errors import ShapeError
from relaylens.selectors import REGISTRY, make_selector
from relaylens.selectors.base import top_positions
from relaylens.selectors.finch import QuestionAttention
from relaylens.selectors.protection import select_protected, source_budget
from relaylens.selectors.synthetic import random_prefill

L, LAYERS, KV = 400, 6, 4
#: history layout: a 30-token instruction head, 8 sessions separated by 2-token gaps (protected), no tail
SIZES = [50, 30, 40, 20, 60, 40, 60, 56]
TEXTS = ["dog walk park", "weather rain", "my dog Biscuit", "cooking pasta", "travel Rome", "dog food", "", "car"]
HEAD, GAP = 30, 2


def _sessions() -> tuple[Span, ...]:
    spans, start = [], HEAD
    for i, (n, text) in enumerate(zip(SIZES, TEXTS)):
        spans.append(Span("session", i, f"s{i}", start, start + n, False, None, text))
        start += n + GAP
    assert spans[-1].end == L
    return tuple(spans)


def _protected_by_hand() -> torch.Tensor:
    mask = torch.zeros(L, dtype=torch.bool)
    mask[:HEAD] = True
    for span in _sessions()[:-1]:
        mask[span.end : span.end + GAP] = True
    return mask


@pytest.fixture(scope="module")
def pre():
    p = random_prefill(length=L, num_layers=LAYERS, num_kv_heads=KV, group=2, head_dim=16, window=32, seed=1)
    gen = torch.Generator().manual_seed(2)
    p.column_sums = [torch.rand(8, L, generator=gen) * torch.arange(L, 0, -1) for _ in range(LAYERS)]
    return p


@pytest.fixture(scope="module")
def prompt():
    return RenderedPrompt("r", torch.zeros(L, dtype=torch.long), torch.zeros(3, dtype=torch.long), "", "",
                          "what is my dog called", _sessions(), ())


_GEN = torch.Generator().manual_seed(3)
OPTIONS = {"scissorhands": {"history_window": 32},
           "finch": {"question_attention": QuestionAttention([torch.rand(8, L, generator=_GEN) for _ in range(LAYERS)],
                                                             [torch.rand(8, L, generator=_GEN)
                                                              for _ in range(LAYERS)])}}
UNIFORM = {"snapkv", "h2o", "cam", "scissorhands", "finch", "streaming", "random"}
P = HEAD + GAP * (len(SIZES) - 1)  # 44 protected tokens
N_SOURCE = L - P  # 356


def test_prompt_marks_everything_outside_the_sessions(prompt):
    assert torch.equal(prompt.protected_mask(), _protected_by_hand())
    assert int(prompt.protected_mask().sum()) == P


def test_source_budget_is_a_ratio_of_the_source_tokens_only():
    assert source_budget(0.2, N_SOURCE) == math.floor(0.2 * 356) == 71
    assert source_budget(64, N_SOURCE) == 64 and source_budget(1000, N_SOURCE) == N_SOURCE


def test_every_selector_is_registered_here():
    assert set(REGISTRY) == UNIFORM | {"pyramidkv", "adakv", "chunkkv", "bm25", "full"}


@pytest.mark.parametrize("budget", [0.2, 96])
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_protected_states_are_kept_and_excluded_from_the_budget(pre, prompt, name, budget):
    sel = select_protected(make_selector(name, **OPTIONS.get(name, {})), pre, prompt, budget)
    protected = _protected_by_hand()
    k_src = 71 if budget == 0.2 else 96
    assert sel.info["protected"] == P and sel.info["source_budget"] == k_src
    source_counts = torch.zeros(LAYERS, KV, dtype=torch.long)
    for l in range(LAYERS):
        for h in range(KV):
            kept = sel.positions[l, h][sel.valid[l, h]]
            flags = protected[kept]
            assert int(flags.sum()) == P, f"{name} layer {l} head {h} lost protected states"
            source_counts[l, h] = int((~flags).sum())
    if name in UNIFORM:
        assert (source_counts == k_src).all(), f"{name}: source states per head {source_counts.unique().tolist()}"
    elif name in ("pyramidkv", "adakv", "chunkkv"):
        # own allocation (per layer / per head / whole chunks) at K_src + P, every head giving P back to the protected
        # states (a head allotted fewer than P keeps only those: PyramidKV's top layer here)
        allotted = make_selector(name).select(pre, prompt, k_src + P).counts  # [layer, kv_head]
        assert torch.equal(source_counts, (allotted - P).clamp_min(0))
        if name == "adakv":  # no head below P: the mean is exactly the source budget
            assert int(source_counts.sum()) == k_src * LAYERS * KV
    elif name == "full":
        assert (source_counts == N_SOURCE).all()
    else:  # bm25 packs whole sessions into the source budget
        counts = source_counts.unique().tolist()
        assert len(counts) == 1 and counts[0] <= k_src
        kept = set(sel.positions[0, 0][sel.valid[0, 0]].tolist())
        whole = sum(s.length for s in prompt.sessions if s.start in kept)
        assert whole == counts[0] and all(set(range(s.start, s.end)) <= kept for s in prompt.sessions
                                          if s.start in kept)


def test_snapkv_equals_force_keeping_the_protected_states(pre, prompt):
    """Independent reference: SnapKV's own pooled window scores with the protected positions forced to +inf,
    top (K_src - w + P) of the prefix, plus the window."""
    snap = make_selector("snapkv")
    k_src, w = 71, snap.window
    scores = snap.scorer.scores(pre).clone()  # [layer, kv_head, L-w]
    protected = _protected_by_hand()
    scores[..., protected[: L - w]] = math.inf
    reference = top_positions(scores, k_src - w + P)  # [layer, kv_head, K_src - w + P]
    sel = select_protected(snap, pre, prompt, 0.2)
    window = torch.arange(L - w, L)
    for l in range(LAYERS):
        for h in range(KV):
            expected = torch.cat([reference[l, h], window])
            assert torch.equal(sel.positions[l, h][sel.valid[l, h]], expected)


def test_merged_values_follow_their_states(pre, prompt):
    raw = make_selector("cam").select(pre, prompt, 71 + P)
    sel = select_protected(make_selector("cam"), pre, prompt, 0.2)
    merged = {p: v for p, v in zip(raw.positions[0, 0].tolist(), raw.values[0, 0])}
    for slot, p in enumerate(sel.positions[0, 0].tolist()):
        expected = merged.get(p, pre.values[0][0, p])  # a protected state CaM did not keep carries its own value
        assert torch.equal(sel.values[0, 0, slot], expected)


def test_no_protected_tokens_is_the_plain_selection(pre):
    prompt = RenderedPrompt("r", torch.zeros(L, dtype=torch.long), torch.zeros(3, dtype=torch.long), "", "", "q",
                            (Span("session", 0, "s0", 0, L, False, None, "x"),), ())
    snap = make_selector("snapkv")
    assert torch.equal(select_protected(snap, pre, prompt, 0.2).positions, snap.select(pre, prompt, 0.2).positions)


@pytest.mark.parametrize("mask, message", [(torch.ones(L, dtype=torch.bool), "every one of the 400"),
                                           (torch.zeros(L - 1, dtype=torch.bool), "shape")])
def test_bad_masks_are_named_errors(pre, mask, message):
    with pytest.raises(ShapeError, match=message):
        select_protected(make_selector("snapkv"), pre, None, 0.2, mask)


def test_memory_runs_take_the_option_and_record_it(tmp_path):
    """Protected framing on a memory task (the default, the paper's regime): the instruction, template and
    separators are kept on top of 30% of the session tokens; the manifest records the option and names the regime
    (the option is absent when off, as before it existed, and the regime then says the framing is evicted)."""
    import json

    from relaylens.datasets import load_records
    from relaylens.datasets.prompting import render_prompt
    from relaylens.datasets.synthetic import generate_records
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import apply_overrides, load_analysis
    from relaylens.results.store import load_tables
    from relaylens.testing import tiny_model, tiny_tokenizer

    data = tmp_path / "records.json"
    data.write_text(json.dumps(generate_records(n=1, seed=3, history_tokens=600)))
    base = load_analysis("main_table").spec
    assert base.protect_instructions is True and base.to_dict()["regime"]["framing"].startswith("protected")
    evicted = base.replace(protect_instructions=False).to_dict()
    assert "protect_instructions" not in evicted and evicted["regime"]["framing"].startswith("evicted")
    spec = apply_overrides(base, selectors=["snapkv:window=8"], conditions=["relay"], budgets=(0.3,), max_new_tokens=2,
                           protect_instructions=True)
    model, tok = tiny_model("llama", seed=0), tiny_tokenizer()
    out = run_analysis(spec, RunConfig(out=str(tmp_path / "run"), data=str(data)), progress=False,
                       model_and_tokenizer=(model, tok))
    mode = "chat" if getattr(tok, "chat_template", None) else "completion"  # what prompt mode auto chose
    prompt = render_prompt(load_records(data)[0], tok, mode=mode)
    protected = int(prompt.protected_mask().sum())
    assert protected > 0
    answers = load_tables(out)["answers"]
    assert (answers["mean_count"] == protected + math.floor(0.3 * (prompt.history_length - protected))).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["spec"]["protect_instructions"] is True
    assert manifest["config"]["spec"]["regime"]["framing"] == "protected (kept outside the budget)"
