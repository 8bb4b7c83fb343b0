"""Every analysis's ``--preset paper`` against the paper's stated settings, field by field.

The expected values below are transcribed by hand from ``reference/paper-settings.md`` (the paper's text), not
read from the presets under test.
"""

from __future__ import annotations

import pytest

from relaylens.errors import RelaylensError
from relaylens.experiments.presets import apply_preset, preset_markdown
from relaylens.experiments.specs import (
    apply_overrides,
    available_analyses,
    load_analysis,
)

SIX = ("bm25", "snapkv", "h2o", "pyramidkv", "chunkkv", "cam")
MEMORY_DECODING = {"max_new_tokens": 512, "stop": "eos", "prompt_mode": "auto"}  # greedy, 512 tokens, EOS, chat
SESSION_GOLD = {"granularity": "session"}  # answer_session_ids: supporting sessions

PAPER = {
    "main_table": {"selectors": SIX, "budgets": (0.10,), "conditions": ("original", "relay"), **MEMORY_DECODING},
    "budget_curves": {"selectors": SIX, "budgets": (0.01, 0.05, 0.10, 0.20), "conditions": ("original", "relay"),
                      **MEMORY_DECODING},
    "coordinate_ablation": {"selectors": ("bm25",), "budgets": (8192,),
                            "conditions": ("original", "key_only", "relay", "query_only(2048)", "common_shift(2048)"),
                            **MEMORY_DECODING},
    "ordering": {"selectors": ("bm25",), "budgets": (0.10,),
                 "conditions_include": ("original", "relay", "score_order", "reverse_order", "random_order(0)"),
                 **MEMORY_DECODING},
    "evidence_reading": {"selectors": ("bm25",), "budgets": (8192,), "conditions": ("original", "half_gap", "relay"),
                         "probes": True, "teacher_forcing": True, **SESSION_GOLD},
    "question_types": {"selectors": ("snapkv",), "budgets": (2048,), "conditions": ("original", "relay"),
                       **MEMORY_DECODING},
    "alignment": {"selectors": ("bm25", "pyramidkv"), "budgets": (0.10,),
                  "conditions": ("original", "rank_sync", "relay"), **MEMORY_DECODING},
    "overhead": {"selectors": ("bm25", "snapkv", "pyramidkv"), "budgets": (2048, 8192),
                 "conditions": ("original", "relay"), "max_new_tokens": 128, "stop": "none", "limit": 20},
    "full_kv": {"selectors": ("full",), "budgets": (1.0,), "conditions": ("original",), **MEMORY_DECODING},
    # Table 2: InfiniteBench, SnapKV at 1%, Original vs RoPERelay (the benchmark's objective metrics)
    "infinitebench": {"selectors": ("snapkv",), "budgets": (0.01,), "conditions": ("original", "relay"),
                      "selector_options": {}},  # SnapKV as published (window 32), not the CPU sample's window 8
    # Table 7: FINCH vs BM25 / PyramidKV / ChunkKV + RoPERelay at 10%, judge / F1 / choice accuracy
    "finch_comparison": {"selectors": ("finch", "bm25", "pyramidkv", "chunkkv"), "budgets": (0.10,),
                         "conditions_include": ("original", "relay"), **MEMORY_DECODING},
    # Tables 10-11: HelloBench summarization, SnapKV 10% of the source text (instructions and templates kept and
    # counted separately), FullKV / Original / RoPERelay, greedy up to 8,192 tokens, EOS
    "summarization": {"selectors": ("snapkv", "full"), "budgets": (0.10,), "conditions": ("original", "relay"),
                      "max_new_tokens": 8192, "stop": "eos", "prompt_mode": "auto", "protect_instructions": True,
                      "selector_options": {}},
    # not an experiment of the paper (issue 17): its decoding and gold unit on the layer scopes
    "layer_scope": {"selectors": ("bm25",), "budgets": (0.10,), "conditions_include": ("original", "relay", "key_only"),
                    "probes": True, "teacher_forcing": True, **MEMORY_DECODING, **SESSION_GOLD},
    # not an experiment of the paper (issue 31): BM25 10%, original vs relay vs learned (96 records from --data)
    "learned_geometry": {"selectors": ("bm25",), "budgets": (0.10,), "conditions": ("original", "relay"),
                         "sensitivity": True, "prompt_mode": "auto", "granularity": "session"},
    # not an experiment of the paper (issue 30): one run per history length, BM25 and SnapKV at 10%
    "history_length": {"selectors": ("bm25", "snapkv"), "budgets": (0.10,), "conditions": ("original", "relay"),
                       "probes": True, **MEMORY_DECODING, **SESSION_GOLD},
    # not an experiment of the paper (issue 39): which part of the framing matters, BM25 10%, original vs relay
    "framing": {"selectors": ("bm25",), "budgets": (0.10,), "conditions": ("original", "relay"),
                "framing_cells": ("none", "sink1", "sink4", "instruction", "template", "headers", "framing", "all"),
                **MEMORY_DECODING},
    "positional_sensitivity": {"selectors": ("bm25",), "budgets": (0.10,),
                               "conditions": ("original", "relay", "key_only"), "sensitivity": True, **MEMORY_DECODING},
}


def test_every_analysis_has_a_paper_preset():
    assert sorted(PAPER) == available_analyses()


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_preset_matches_the_paper_field_by_field(name):
    spec = apply_preset(load_analysis(name), "paper")
    for field, expected in PAPER[name].items():
        if field == "conditions_include":
            assert set(expected) <= set(spec.conditions), name
            continue
        got = getattr(spec, field)
        assert got == expected, f"{name}.{field}: preset {got!r}, paper {expected!r}"
    if name != "overhead":
        assert not spec.limit, f"{name}: the paper preset runs every record (the paper's sizes come from --data)"
    if spec.probes:
        assert spec.granularity == "session", f"{name}: the paper's gold evidence is the supporting session"


def test_default_spec_is_unchanged_without_a_preset_and_unknown_presets_fail():
    analysis = load_analysis("main_table")
    assert apply_preset(analysis, None) is analysis.spec
    with pytest.raises(RelaylensError, match="no preset 'fast'"):
        apply_preset(analysis, "fast")


def test_readme_table_lists_every_analysis():
    table = preset_markdown()
    for name in PAPER:
        assert f"| {name} |" in table


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(selectors=["nosuch"]), "unknown selector"),
    (dict(selectors=["bm25:k9=1"]), "no hyperparameter"),
    (dict(selectors=["bm25:packing"]), "not key=value"),
    (dict(conditions=["sideways"]), "condition"),
    (dict(granularity="paragraph"), "granularity"),
    (dict(stop="never"), "stop"),
])
def test_bad_overrides_are_one_clear_error(kwargs, message):
    with pytest.raises(RelaylensError, match=message):
        apply_overrides(load_analysis("main_table").spec, **kwargs)


def test_overrides_replace_selectors_and_add_original():
    spec = apply_overrides(load_analysis("ordering").spec, selectors=["bm25:k1=1.2", "snapkv"],
                           conditions=["relay", "compaction(0.5)"], granularity="session", stop="newline")
    assert spec.selectors == ("bm25", "snapkv") and spec.selector_options == {"bm25": {"k1": 1.2}}
    assert spec.conditions[0] == "original" and len(spec.conditions) == 3
    assert (spec.granularity, spec.stop) == ("session", "newline")
