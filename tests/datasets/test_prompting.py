"""Prompt rendering: exact joint tokenisation, unit spans over the right tokens, no gold leaks, both modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.prompting_shared import MODES, tok_fixture  # noqa: F401 - pytest fixture (named tok)

from relaylens.datasets import load_records
from relaylens.datasets.prompting import (
    INSTRUCTION,
    layout_prompt,
    question_block,
    render_prompt,
)
from relaylens.datasets.records import Record, Session, Turn

FIXTURES = Path(__file__).parents[1] / "fixtures"
FORMATS = ("nl", "json")


@pytest.fixture(scope="module")
def records():
    return load_records(FIXTURES / "longmemeval_small.json")


def straddling_tokenizer():
    """BPE without a whitespace pre-split: learns the token '.\\n\\nCu' across the history/question boundary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<eos>"])
    tok.train_from_iterator(["Biscuit.\n\nCurrent Date: 2023\nQuestion: x"] * 50, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_history_plus_question_is_the_joint_tokenisation(tok, records, mode, fmt):
    for rec in records:
        p = render_prompt(rec, tok, mode=mode, history_format=fmt)
        ids = torch.cat([p.history_ids, p.question_ids]).tolist()
        text = p.history_text + p.question_text
        assert tok.decode(ids) == text
        assert tok(text, add_special_tokens=False)["input_ids"] == ids
        assert tok.decode(p.history_ids.tolist()) == p.history_text
        assert p.history_ids.dtype == torch.long and p.history_ids.ndim == 1 and p.question_ids.numel() > 0
        assert p.mode == mode and p.question == rec.question
        if mode == "chat":
            assert text == tok.apply_chat_template([{"role": "user", "content": layout_prompt(rec, mode, fmt).text}],
                                                   tokenize=False, add_generation_prompt=True)
            assert p.question_text.startswith("Current Date:") and p.question_text.endswith("<|im_start|>assistant\n")
            assert p.history_text.startswith("<|im_start|>user\n" + INSTRUCTION)
        else:
            assert text == layout_prompt(rec, mode, fmt).text
            assert p.question_text == question_block(rec, "completion")
            assert p.question_text.endswith("\nShort answer:")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_spans_cover_their_units(tok, records, mode, fmt):
    for rec in records:
        p = render_prompt(rec, tok, mode=mode, history_format=fmt)
        L = p.history_length
        assert [s.index for s in p.turns] == list(range(len(p.turns)))
        assert len(p.turns) == rec.num_turns and len(p.sessions) == len(rec.sessions)
        for kind_spans in (p.sessions, p.turns):
            for a, b in zip(kind_spans, kind_spans[1:]):
                assert 0 <= a.start < a.end <= b.start < b.end <= L  # ordered, non-overlapping
        for span in p.turns:
            decoded = tok.decode(p.history_ids[span.start : span.end].tolist())
            shown = span.text if fmt == "nl" else json.dumps(span.text)[1:-1]
            assert shown in decoded, (span, decoded)
            assert span.role in decoded
        for span in p.sessions:
            decoded = tok.decode(p.history_ids[span.start : span.end].tolist())
            assert decoded.lstrip().startswith("### Session") and span.length > 0
        turn_spans_in = {s.session_id: [t for t in p.turns if t.session_id == s.session_id] for s in p.sessions}
        for s in p.sessions:
            assert all(s.start <= t.start and t.end <= s.end for t in turn_spans_in[s.session_id])


def test_evidence_flags_and_mask(tok, records):
    rec = next(r for r in records if r.question_type == "single-session-assistant")
    p = render_prompt(rec, tok)
    ev_turns = [t for t in p.turns if t.is_evidence]
    assert [t.role for t in ev_turns] == ["assistant"] and "Copper Kettle" in ev_turns[0].text
    assert [s.session_id for s in p.sessions if s.is_evidence] == ["answer_a1b2c3d4"]
    mask = p.evidence_mask("turn")
    assert mask.sum() == ev_turns[0].length and mask[ev_turns[0].start : ev_turns[0].end].all()
    assert p.evidence_mask("session").sum() == next(s for s in p.sessions if s.is_evidence).length


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_no_gold_markers_in_prompt(tok, records, mode, fmt):
    for rec in records:
        p = render_prompt(rec, tok, mode=mode, history_format=fmt)
        text = p.history_text + p.question_text
        for marker in ("has_answer", "answer_", "sharegpt_", "ultrachat_", "85a1be56", "answer_session_ids",
                       rec.record_id):
            assert marker not in text
        if not rec.is_abstention:
            assert rec.answers[0] not in p.question_text


def test_sessions_sorted_by_date_and_numbered(tok, records):
    rec = next(r for r in records if r.record_id == "gpt4_2655b836")  # file order is not chronological (oracle)
    p = render_prompt(rec, tok, mode="completion")
    assert [s.session_id for s in p.sessions] == ["answer_4be1b6b4_1", "ultrachat_123456", "answer_4be1b6b4_2"]
    text = p.history_text
    assert (text.index("### Session 1:\nSession Date: 2023/05/28 (Sun) 11:15\nSession Content:\n")
            < text.index("### Session 3:"))
    assert "\n\nuser: I picked up 2 plants" in text


def test_layout_matches_upstream_format(records):
    rec = records[0]
    text = layout_prompt(rec, "chat", "json").text
    body = "\n" + json.dumps([{"role": t.role, "content": t.content} for t in rec.sessions[1].turns])
    assert f"\n### Session 2:\nSession Date: {rec.sessions[1].date}\nSession Content:\n{body}\n" in text
    assert text.startswith(INSTRUCTION + "\n\n\nHistory Chats:\n\n\n### Session 1:")
    assert text.endswith(f"\n\nCurrent Date: {rec.question_date}\nQuestion: {rec.question}\nAnswer:")


def test_straddling_token_goes_to_question():
    tok = straddling_tokenizer()
    rec = Record("q", "x", ("y",), "single-session-user", "2023/05/30 (Tue) 23:40",
                 (Session("s", None, (Turn("user", "Biscuit."),)),), (), False)
    p = render_prompt(rec, tok, mode="completion")
    ids = torch.cat([p.history_ids, p.question_ids]).tolist()
    assert ids == tok(p.history_text + p.question_text, add_special_tokens=False)["input_ids"]
    assert not p.question_text.startswith("Current Date")  # the boundary moved back to the straddling token's start
    assert p.question_text.endswith("Current Date: 2023/05/30 (Tue) 23:40\nQuestion: x\nShort answer:")
    assert p.turns[0].end <= p.history_length


def test_options_and_missing_dates(tok):
    rec = Record("m", "Which one?", ("(b) two",), "x", None,
                 (Session("c", None, (Turn("document", "Some book text."), Turn("system", "persona"))),), (), False,
                 options=("(a) one", "(b) two"), correct_option="b")
    p = render_prompt(rec, tok, mode="completion")
    assert p.question_text == "Question: Which one?\n(a) one\n(b) two\nShort answer:"
    assert "Session Date" not in p.history_text and "\n\nSome book text." in p.history_text
    assert "system: persona" in p.history_text


def test_bad_arguments(tok, records):
    with pytest.raises(ValueError, match="mode"):
        render_prompt(records[0], tok, mode="instruct")
    with pytest.raises(ValueError, match="history_format"):
        render_prompt(records[0], tok, history_format="xml")
    bare = straddling_tokenizer()
    with pytest.raises(ValueError, match="chat template"):
        render_prompt(records[0], bare, mode="chat")


def test_synthetic_sample_renders(tok):
    from relaylens.datasets.longmemeval import parse_record
    from relaylens.datasets.synthetic import generate_records

    for raw in generate_records(7, seed=3, history_tokens=800):
        rec = parse_record(raw, "<synthetic>", raw["question_id"])
        p = render_prompt(rec, tok)
        assert any(t.is_evidence for t in p.turns)
        for t in p.turns:
            if t.is_evidence:
                assert t.text in tok.decode(p.history_ids[t.start : t.end].tolist())


