"""The LoCoMo reader: records per question, evidence masks from dialogue ids, malformed ids, bad input."""

from __future__ import annotations

import copy
import json

import pytest

from relaylens.datasets import detect_format, load_records, load_records_with_report
from relaylens.datasets.locomo import TEMPORAL_HINT, evidence_counts, parse_evidence
from relaylens.datasets.prompting import render_prompt
from relaylens.errors import RecordError
from relaylens.testing import tiny_tokenizer


def _turn(dia, speaker, text, caption=None):
    turn = {"speaker": speaker, "dia_id": dia, "text": text}
    if caption:
        turn |= {"img_url": ["http://example.invalid/x.jpg"], "blip_caption": caption, "query": "x"}
    return turn


CONVERSATION = {
    "sample_id": "conv-1",
    "conversation": {
        "speaker_a": "Ana", "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [_turn("D1:1", "Ana", "I adopted a cat named Pixel yesterday."),
                      _turn("D1:2", "Ben", "Lovely! I went hiking in the Alps."),
                      _turn("D1:3", "Ana", "Look at my garden.", caption="a photo of red tulips")],
        "session_2_date_time": "10:00 am on 20 June, 2023",
        "session_2": [_turn("D2:1", "Ben", "I started painting lessons last week."),
                      _turn("D2:2", "Ana", "Pixel knocked over my tea again.")],
        "session_3_date_time": "9:00 am on 1 July, 2023",  # upstream has dates of sessions that are not there
    },
    "qa": [
        {"question": "What hobbies did Ben take up?", "answer": "hiking, painting", "evidence": ["D1:2", "D2:1"],
         "category": 1},
        {"question": "When did Ana adopt a cat?", "answer": "7 May 2023", "evidence": ["D1:1"], "category": 2},
        {"question": "Would Ana like gardening?", "answer": "Yes; she grows tulips", "evidence": ["D1:3"],
         "category": 3},
        {"question": "What is Ana's cat called?", "answer": "Pixel", "evidence": ["D1:1; D2:2"], "category": 4},
        {"question": "What is Ben's cat called?", "adversarial_answer": "Pixel", "evidence": ["D1:1"],
         "category": 5},
        {"question": "Where did Ben hike?", "answer": "the Alps", "evidence": ["D:1:02", "D9:9", "D"],
         "category": 4},
        {"question": "Is Ana kind?", "answer": "yes", "evidence": [], "category": 3},
    ],
}


def _write(tmp_path, convs, name="locomo.json"):
    path = tmp_path / name
    path.write_text(json.dumps(convs))
    return path


@pytest.fixture
def records(tmp_path):
    return load_records(_write(tmp_path, [CONVERSATION]))


def test_one_record_per_question_with_ids_types_and_clusters(tmp_path, records):
    assert detect_format(_write(tmp_path, [CONVERSATION])) == "locomo"
    assert [r.record_id for r in records] == [f"conv-1:q{k:04d}" for k in range(7)]
    assert [r.question_type for r in records] == ["multi_hop", "temporal", "open_domain", "single_hop",
                                                  "adversarial", "single_hop", "open_domain"]
    assert {r.cluster_id for r in records} == {"conv-1"} and {r.source for r in records} == {"locomo"}
    assert [r.is_abstention for r in records] == [False] * 4 + [True] + [False] * 2
    assert records[4].answers == ("Pixel",) and records[4].meta["category"] == 5  # adversarial_answer
    assert records[1].question == "When did Ana adopt a cat?" + TEMPORAL_HINT
    assert records[0].question == "What hobbies did Ben take up?"
    sessions = records[0].sessions
    assert [s.session_id for s in sessions] == ["session_1", "session_2"]  # the date of session 3 alone is no session
    assert sessions[0].date == "1:56 pm on 8 May, 2023"
    assert [t.role for t in sessions[0].turns] == ["Ana", "Ben", "Ana"]
    assert sessions[0].turns[2].content == 'Ana said, "Look at my garden." and shared a photo of red tulips.'


def test_evidence_marks_turns_and_their_sessions(records):
    def gold(record):
        return [(s.session_id, j) for s in record.sessions for j, t in enumerate(s.turns) if t.has_answer]

    assert gold(records[0]) == [("session_1", 1), ("session_2", 0)]
    assert records[0].evidence_session_ids == ("session_1", "session_2")
    assert gold(records[1]) == [("session_1", 0)] and records[1].evidence_session_ids == ("session_1",)
    assert [s.is_evidence for s in records[1].sessions] == [True, False]
    assert gold(records[6]) == [] and not records[6].has_evidence_annotations  # no evidence ids: no gold


def test_malformed_ids_follow_the_documented_rules_and_are_counted(records):
    assert records[3].meta["evidence"] == ["D1:1", "D2:2"] and records[3].meta["evidence_split"] == ["D1:1; D2:2"]
    ben = records[5].meta
    assert ben["evidence"] == ["D1:2"] and ben["evidence_normalised"] == ["D:1:02"]
    assert ben["evidence_unresolved"] == ["D9:9", "D"]
    assert evidence_counts(records) == {"questions": 7, "with_evidence": 6, "without_evidence": 1,
                                        "ids_resolved": 8, "ids_split": 1, "ids_normalised": 1,
                                        "ids_unresolved": 2}
    turns = {(1, 1): "D1:1"}
    assert parse_evidence(["D01:001"], turns) == (("D1:1",), [], ["D01:001"], [])
    with pytest.raises(RecordError, match="name no turn"):
        parse_evidence(["D1:1", "D5:5"], turns, strict=True)


def test_the_prompt_masks_exactly_the_evidence_turns_and_shares_one_history(records):
    tok = tiny_tokenizer()
    prompts = [render_prompt(r, tok, mode="completion") for r in records]
    assert all(p.history_ids.tolist() == prompts[0].history_ids.tolist() for p in prompts)  # one prefill serves all
    prompt = prompts[0]
    assert prompt.history_text.count("Ana and Ben") == 1 and "DATE: 10:00 am on 20 June, 2023" in prompt.history_text
    assert "Question: What hobbies did Ben take up?" in prompt.question_text
    mask = prompt.evidence_mask("turn")
    marked = [t for t in prompt.turns if bool(mask[t.start:t.end].all())]
    assert [t.text for t in marked] == ['Ben said, "Lovely! I went hiking in the Alps."',
                                        'Ben said, "I started painting lessons last week."']
    assert int(mask.sum()) == sum(t.length for t in marked)
    session_mask = prompts[1].evidence_mask("session")
    first = prompts[1].sessions[0]
    assert int(session_mask.sum()) == first.length and bool(session_mask[first.start:first.end].all())


def test_bad_input_names_file_conversation_and_question(tmp_path):
    bad = copy.deepcopy(CONVERSATION)
    bad["qa"][1]["evidence"] = ["D7:1", "X"]
    path = _write(tmp_path, [bad])
    with pytest.raises(RecordError) as err:
        load_records(path)
    assert str(path) in str(err.value) and "conv-1" in str(err.value) and "question 1" in str(err.value)
    assert "Fix:" in str(err.value)
    with pytest.raises(RecordError, match="name no turn"):
        load_records(_write(tmp_path, [CONVERSATION], "strict.json"), strict_evidence=True)

    empty = copy.deepcopy(CONVERSATION)
    empty["conversation"] = {k: v for k, v in empty["conversation"].items() if not k.startswith("session_")}
    with pytest.raises(RecordError, match=r"conv-1.*session_N.*Fix"):
        load_records(_write(tmp_path, [empty], "empty.json"), format="locomo")

    no_qa = {k: v for k, v in CONVERSATION.items() if k != "qa"}
    with pytest.raises(RecordError, match=r"'qa'"):
        load_records(_write(tmp_path, [no_qa], "noqa.json"), format="locomo")

    odd = copy.deepcopy(CONVERSATION)
    odd["qa"][0]["category"] = 9
    with pytest.raises(RecordError, match=r"question 0.*category"):
        load_records(_write(tmp_path, [odd], "odd.json"))

    with pytest.warns(UserWarning, match="skipped 1"):
        records, report = load_records_with_report(_write(tmp_path, [empty, CONVERSATION], "mixed.json"),
                                                   format="locomo", lenient=True)
    assert len(records) == 7 and report.num_skipped == 1
