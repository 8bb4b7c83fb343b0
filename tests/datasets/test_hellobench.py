"""The HelloBench summarization reader, its bundled generated sample, and the prompt layout (protected head)."""

from __future__ import annotations

import json

import pytest

from relaylens.datasets import detect_format, load_records
from relaylens.datasets.hellobench import CATEGORIES, WEIGHTS_FILE
from relaylens.datasets.prompting import render_prompt
from relaylens.datasets.synthetic_hellobench import (
    bundled_hellobench_path,
    hellobench_rows,
)
from relaylens.errors import RecordError
from relaylens.testing import tiny_tokenizer

CHECKLIST = ["Is it easy to read?", "Is the summary accurate with respect to the text?",
             "Does the summary cover the important information?"]


def _item(**changes) -> dict:
    text = "Ann moved to Lyon in 2019. She opened a bakery with 12 tables."
    item = {"id": "summarization_900", "category": "news", "raw_text": text,
            "chat_prompt": f"Summarize the news.\n[Text Start]: \n{text}\n[Text End]", "checklists": list(CHECKLIST),
            "num_checklist": 3, "requirements": ["be short"]}
    item.update(changes)
    return {k: v for k, v in item.items() if v is not None}


def _write(tmp_path, *items) -> str:
    path = tmp_path / "summarization.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return str(path)


def test_bundled_sample_is_regenerated_byte_for_byte_and_reads():
    expected = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in hellobench_rows(seed=0))
    assert bundled_hellobench_path().read_text("utf-8") == expected
    assert detect_format(bundled_hellobench_path()) == "hellobench"
    records = load_records(bundled_hellobench_path())
    assert len(records) == 10 and sorted({r.question_type for r in records}) == sorted(CATEGORIES)
    for r in records:
        assert r.source == "hellobench" and r.answers == () and len(r.meta["checklist"]) == 6
        assert [c["aspect"] for c in r.meta["checklist"]].count("factuality") == 1
        assert [c["aspect"] for c in r.meta["checklist"]].count("coverage") == 1
        assert r.meta["weights_from"] == "item"


def test_fields_weights_and_aspects(tmp_path):
    (record,) = load_records(_write(tmp_path, _item()))
    assert record.record_id == "summarization_900" and record.question_type == "news"
    assert record.sessions[0].turns[0].content.startswith("Ann moved")
    assert record.meta["prompt_head"] == "Summarize the news.\n[Text Start]: \n"
    assert record.meta["prompt_tail"] == "\n[Text End]" and record.meta["requirements"] == ["be short"]
    assert [c["aspect"] for c in record.meta["checklist"]] == ["other", "factuality", "coverage"]
    assert [c["weight"] for c in record.meta["checklist"]] == [1.0, 1.0, 1.0] and record.meta["weights_from"] == "equal"


def test_weights_file_beside_the_data_applies_per_category(tmp_path):
    (tmp_path / WEIGHTS_FILE).write_text(json.dumps({"news": [5.0, 20.0, 15.0]}))
    (record,) = load_records(_write(tmp_path, _item()))
    assert [c["weight"] for c in record.meta["checklist"]] == [5.0, 20.0, 15.0]
    assert record.meta["weights_from"] == WEIGHTS_FILE


def test_the_instruction_head_is_exactly_the_protected_part(tmp_path):
    (record,) = load_records(_write(tmp_path, _item()))
    tok = tiny_tokenizer()
    for mode in ("completion", "chat"):
        prompt = render_prompt(record, tok, mode=mode)
        mask = prompt.protected_mask()
        head = tok.decode(prompt.history_ids[mask])
        assert head.endswith(("Summarize the news.\n[Text Start]: \n", "Summarize the news.\n[Text Start]:"))
        assert "Ann" not in head and "Ann moved" in tok.decode(prompt.history_ids[~mask])
        assert prompt.question_text.lstrip().startswith("[Text End]") or "[Text End]" in prompt.question_text
        assert "<|im_start|>" in head if mode == "chat" else "<|im_start|>" not in head


@pytest.mark.parametrize("changes, field", [
    (dict(raw_text=None), "'raw_text'"),
    (dict(raw_text="   "), "'raw_text'"),
    (dict(chat_prompt="Summarize this text please."), "'chat_prompt'"),
    (dict(category=None), "'category'"),
    (dict(checklists=[]), "'checklists'"),
    (dict(checklists="Is it good?"), "'checklists'"),
    (dict(num_checklist=4), "'num_checklist'"),
    (dict(checklists=[*CHECKLIST[:2], 7]), "'checklists[2]'"),
    (dict(checklist_weights=[1.0, 2.0]), "'checklist_weights'"),
    (dict(checklists=[*CHECKLIST[:2], {"text": CHECKLIST[2], "weight": -1}]), "'checklists[2].weight'"),
    (dict(checklists=[*CHECKLIST[:2], {"text": CHECKLIST[2], "weight": float("nan")}]), "'checklists[2].weight'"),
    (dict(checklists=[*CHECKLIST[:2], {"text": CHECKLIST[2], "aspect": "style"}]), "'checklists[2].aspect'"),
    (dict(checklists=[CHECKLIST[0], CHECKLIST[2]], num_checklist=None), "at least one factuality item"),
    (dict(checklists=CHECKLIST[:2], num_checklist=None), "at least one coverage item"),
])
def test_malformed_items_are_named_errors(tmp_path, changes, field):
    with pytest.raises(RecordError) as err:
        load_records(_write(tmp_path, _item(**changes)), format="hellobench")
    message = str(err.value)
    assert "record id 'summarization_900'" in message and field in message and "Fix:" in message


def test_lenient_load_skips_a_bad_item_and_keeps_the_rest(tmp_path):
    path = _write(tmp_path, _item(), _item(id="summarization_901", checklists=[]))
    assert [r.record_id for r in load_records(path, lenient=True)] == ["summarization_900"]


def test_bad_weights_file_is_a_named_error(tmp_path):
    (tmp_path / WEIGHTS_FILE).write_text("{not json")
    with pytest.raises(RecordError, match=WEIGHTS_FILE):
        load_records(_write(tmp_path, _item()), format="hellobench")


# --- HelloBench's own wording and weights (github.com/Quehry/HelloBench, named in
# relaylens/data/helloeval_summarization.json)

def test_real_helloeval_checklists_keep_the_length_item_out_of_coverage():
    """Every category's item 1 ("Is the summary sufficiently long and complete? ... long enough to cover the key
    information ...") asks about length: ``other``, never coverage; item 2 is factuality, item 3 coverage."""
    from relaylens.datasets.hellobench import HELLOEVAL, checklist_aspect

    assert sorted(HELLOEVAL["checklists"]) == sorted(CATEGORIES)
    for category, items in HELLOEVAL["checklists"].items():
        assert items[1].startswith("Is the summary sufficiently long and complete?") and "cover the key" in items[1]
        aspects = [checklist_aspect(text) for text in items]
        assert aspects[1] == "other", category
        assert aspects.count("factuality") == 1 and aspects[2] == "factuality", (category, aspects)
        assert aspects.count("coverage") == 1 and aspects[3] == "coverage", (category, aspects)


@pytest.mark.parametrize("question, aspect", [
    ("Is the summary long enough to cover the key points?", "other"),
    ("Is the summary too short to cover everything important?", "other"),
    ("Is the summary of an appropriate length for the report?", "other"),
    ("Is the summary sufficiently lengthy? It should cover all sections.", "other"),
    ("Does the summary cover the long dialogue's key topics?", "coverage"),
    ("Is the summary accurate? It should also cover the figures.", "factuality"),
    ("Does the summary cover the main points? Check that it is accurate.", "coverage"),
])
def test_aspect_is_decided_by_the_question_and_length_is_other(question, aspect):
    from relaylens.datasets.hellobench import checklist_aspect

    assert checklist_aspect(question) == aspect


def test_helloeval_weights_are_the_default_and_match_their_checklists():
    from relaylens.datasets.hellobench import HELLOEVAL

    assert "Quehry/HelloBench" in HELLOEVAL["source"]["repository"] and "WEIGHT_DICT" in HELLOEVAL["source"]["weights"]
    for category, weights in HELLOEVAL["weights"].items():
        assert len(weights) == len(HELLOEVAL["checklists"][category]) and sum(weights) == pytest.approx(100.0)
    assert HELLOEVAL["weights"]["news"][:2] == [5.746318852823619, 18.828108458188307]


def test_item_without_checklist_or_weights_gets_the_published_ones(tmp_path):
    from relaylens.datasets.hellobench import HELLOEVAL
    from relaylens.scoring.checklist import checklist_metrics

    (record,) = load_records(_write(tmp_path, _item(category="report", checklists=None, num_checklist=None)))
    checklist = record.meta["checklist"]
    assert [c["text"] for c in checklist] == HELLOEVAL["checklists"]["report"]
    assert [c["weight"] for c in checklist] == HELLOEVAL["weights"]["report"]
    assert record.meta["weights_from"] == "helloeval" and record.meta["checklist_from"] == "helloeval"
    scores = [1.0, 0.0, 1.0, 0.5, 1.0, 1.0]
    metrics = checklist_metrics(scores, checklist)
    weights = HELLOEVAL["weights"]["report"]
    assert metrics["quality"] == pytest.approx(sum(w * s for w, s in zip(weights, scores)) / 100.0)
    assert metrics["coverage"] == 0.5 and metrics["factuality"] == 1.0, "the length item is not averaged into coverage"


def test_own_checklist_of_the_published_length_takes_the_published_weights(tmp_path):
    from relaylens.datasets.hellobench import HELLOEVAL

    own = ["Is it clear?", "Is it long enough?", "Is it accurate?", "Does it cover the key facts?", "Requirements?",
           "Flawless?"]
    (record,) = load_records(_write(tmp_path, _item(category="blogs", checklists=own, num_checklist=None)))
    assert [c["weight"] for c in record.meta["checklist"]] == HELLOEVAL["weights"]["blogs"]
    assert record.meta["weights_from"] == "helloeval" and record.meta["checklist_from"] == "item"
