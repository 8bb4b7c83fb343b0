"""The framing analysis: every cell keeps its own framing on top of one shared source budget, end to end on a tiny
model; the framing parts of a prompt partition its non-turn tokens, for completion and chat prompts."""

from __future__ import annotations

import pytest
import torch

from relaylens.datasets import bundled_sample_path, load_records
from relaylens.datasets.prompting import render_prompt
from relaylens.errors import RelaylensError
from relaylens.experiments.config import RunConfig
from relaylens.experiments.runner import run_analysis
from relaylens.experiments.specs import ExperimentSpec, load_analysis
from relaylens.results.store import load_tables
from relaylens.selectors.protection import FRAMING_CELLS, framing_mask
from relaylens.testing import tiny_model, tiny_tokenizer


def _chat_tokenizer():
    tok = tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok


@pytest.mark.parametrize("mode", ["completion", "chat"])
def test_framing_parts_partition_the_non_turn_tokens(mode):
    tok = _chat_tokenizer() if mode == "chat" else tiny_tokenizer()
    prompt = render_prompt(load_records(bundled_sample_path())[0], tok, mode=mode)
    parts = prompt.framing_parts()
    stacked = torch.stack(list(parts.values())).int()  # [part, L]
    assert int(stacked.sum(0).max()) <= 1  # disjoint
    in_turn = torch.zeros(prompt.history_length, dtype=torch.bool)
    for span in prompt.turns:
        in_turn[span.start : span.end] = True
    assert torch.equal(stacked.sum(0).bool(), ~in_turn)  # together: every token outside the turns
    assert torch.equal(parts["template"] | parts["instruction"] | parts["separators"], prompt.protected_mask())
    text = tok.decode(prompt.history_ids[parts["instruction"]])
    assert "I will give you several history chats" in text and "History Chats" in text
    assert "Session Date" in tok.decode(prompt.history_ids[parts["headers"]])
    head = tok.decode(prompt.history_ids[parts["template"]])
    assert ("<|im_start|>user" in head) if mode == "chat" else (head == "" or head == tok.bos_token)


def test_cells_keep_their_framing_on_one_source_budget(tmp_path):
    model, tok = tiny_model("llama", seed=0), tiny_tokenizer()
    spec = load_analysis("framing").spec.replace(max_new_tokens=2, prompt_mode="completion", budgets=(0.2,))
    assert spec.framing_cells == FRAMING_CELLS and spec.protect_instructions
    out = run_analysis(spec, RunConfig(limit=1, out=str(tmp_path / "run")), progress=False,
                       model_and_tokenizer=(model, tok))
    answers = load_tables(out)["answers"]
    assert sorted(answers["selector"].unique()) == sorted(f"bm25@keep={c}" for c in FRAMING_CELLS)
    # what each cell kept: recompute the selections through the same runner path and check the kept framing
    from relaylens.experiments.units import prefill_record, select_units, selector_objects

    record = load_records(bundled_sample_path())[0]
    prompt = render_prompt(record, tok, mode="completion")
    prefill = prefill_record(model, prompt, RunConfig(), [])
    selectors = selector_objects(spec, 0)
    units, _ = select_units(prefill, prompt, [(s, 0.2) for s in spec.unit_selectors()], selectors, True)
    sessions = prompt.history_length - int(prompt.protected_mask().sum())
    for unit in units:
        cell = unit.selector.split("@keep=")[1]
        kept = torch.zeros(prompt.history_length, dtype=torch.bool)
        kept[unit.selection.positions[0, 0][unit.selection.valid[0, 0]]] = True
        wanted = framing_mask(prompt, cell)
        assert bool(kept[wanted].all()), cell  # the cell's framing is kept
        assert int((kept & ~wanted).sum()) <= int(0.2 * sessions), cell  # within one source budget
        if cell == "none":
            assert not kept[prompt.protected_mask()].any()  # BM25 keeps turns only: the framing is evicted


def test_manifest_names_the_regime(tmp_path):
    spec = ExperimentSpec("x", ("bm25",), (0.1,), ("original", "relay"))
    assert spec.to_dict()["regime"]["framing"].startswith("protected")
    assert spec.replace(protect_instructions=False).to_dict()["regime"]["framing"].startswith("evicted")
    assert spec.max_new_tokens == 512 and spec.prompt_mode == "auto"


def test_unknown_or_repeated_cells_are_refused():
    with pytest.raises(RelaylensError, match="framing cells"):
        ExperimentSpec("x", ("bm25",), (0.1,), ("original",), framing_cells=("nothing",))
    with pytest.raises(RelaylensError, match="framing cells"):
        ExperimentSpec("x", ("bm25",), (0.1,), ("original",), framing_cells=("none", "none"))


def test_a_history_without_sessions_cannot_be_split():
    from relaylens.datasets.spans import RenderedPrompt

    prompt = RenderedPrompt("r0", torch.arange(5), torch.arange(2), "", "", "q", (), ())
    with pytest.raises(RelaylensError, match="r0.*no session"):
        prompt.framing_parts()


def test_the_plan_counts_every_cell(tmp_path):
    """A framing run's manifest plans one unit per (record, selector, cell, budget): figures, reports and merge
    count its progress against that plan, not against the bare selectors."""
    import json

    from relaylens.results.shards import plan_progress
    from relaylens.results.store import RunStore, UnitKey

    model, tok = tiny_model("llama", seed=0), tiny_tokenizer()
    spec = load_analysis("framing").spec.replace(max_new_tokens=1, prompt_mode="completion", budgets=(0.2,),
                                                 framing_cells=("none", "sink4"))
    out = run_analysis(spec, RunConfig(limit=2, out=str(tmp_path / "run")), progress=False,
                       model_and_tokenizer=(model, tok))
    manifest = json.loads((out / "manifest.json").read_text())
    hashes = [p.name.split(".")[0] for p in RunStore.open(out).unit_paths()]
    assert plan_progress(manifest, hashes) == (4, 4)
    rid = manifest["plan"]["record_ids"][0]
    assert plan_progress(manifest, [UnitKey(rid, "bm25@keep=none", 0.2).hash]) == (1, 4)
