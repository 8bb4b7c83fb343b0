"""Issue 28 item 16: every reader refuses what would be scored wrongly without an error: duplicate or empty
multiple-choice options (InfiniteBench En.MC, PersonaMem), an En.Dia record without its ``$$MASK$$``, and an empty
question (LongMemEval and Long-MT-Bench+ accepted one; the other readers refused it). The rules live in
``check_record``, which every reader's records pass through."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from relaylens.datasets import load_records
from relaylens.errors import RecordError

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _jsonl(tmp_path, name: str, edit) -> Path:
    objects = [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]
    edit(objects[0])
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(o) for o in objects) + "\n")
    return path


def _persona(tmp_path, options: str) -> Path:
    rows = list(csv.DictReader(open(FIXTURES / "questions_32k.csv", newline="")))
    rows[0]["all_options"] = options
    path = tmp_path / "questions_32k.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (tmp_path / "shared_contexts_32k.jsonl").write_text((FIXTURES / "shared_contexts_32k.jsonl").read_text())
    return path


def _set_options(options):
    def edit(obj):
        obj["options"], obj["answer"] = options, [options[0]]
    return edit


@pytest.mark.parametrize("options",
                         [["Elizabeth", "Darcy", "Elizabeth", "Jane"], ["Elizabeth", "Darcy", "elizabeth ", "Jane"],
                                     ["Elizabeth", "Darcy", "  ", "Jane"]])
def test_infinitebench_choice_options_must_be_distinct_and_non_empty(tmp_path, options):
    path = _jsonl(tmp_path, "longbook_choice_eng.jsonl", _set_options(options))
    with pytest.raises(RecordError, match=r"longbook_choice_eng\.jsonl: record id 0 .*option.*Fix"):
        load_records(path)
    with pytest.warns(UserWarning):  # lenient: that record is skipped, the others load
        assert len(load_records(path, lenient=True)) == len(load_records(FIXTURES / "longbook_choice_eng.jsonl")) - 1


@pytest.mark.parametrize("options", ["['(a) Twice a week.', '(b) Every day.', '(c) Twice a week.', '(d) Never.']",
                                     "['(a) Twice a week.', '(b) Every day.', '(c) twice a  WEEK.', '(d) Never.']",
                                     "['Twice a week.', 'Every day.', 'Twice a week.']",
                                     "['(a) Twice a week.', '(b) ', '(c) Never.']"])
def test_personamem_options_must_be_distinct_and_non_empty(tmp_path, options):
    with pytest.raises(RecordError, match=r"questions_32k\.csv: question '3f2a9c1e.*option.*Fix"):
        load_records(_persona(tmp_path, options))


def test_en_dia_record_without_mask_is_refused(tmp_path):
    def unmask(obj):
        obj["context"] = obj["context"].replace("$$MASK$$", "Bob")
    path = _jsonl(tmp_path, "longdialogue_qa_eng.jsonl", unmask)
    with pytest.raises(RecordError, match=r"record id 0 .*field 'context'.*\$\$MASK\$\$.*Fix"):
        load_records(path)


@pytest.mark.parametrize("question", ["", "   ", "\n\t"])
def test_longmemeval_empty_question_is_refused(tmp_path, question):
    data = json.loads((FIXTURES / "longmemeval_small.json").read_text())
    data[0]["question"] = question
    path = tmp_path / "lme.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=rf"lme\.json: record {data[0]['question_id']!r}.*question is empty.*Fix"):
        load_records(path)


@pytest.mark.parametrize("question", ["", "  "])
def test_longmtbench_empty_question_is_refused(tmp_path, question):
    data = json.loads((FIXTURES / "longmtbench.json").read_text())
    data[0]["questions"][1] = question
    path = tmp_path / "longmtbench.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=r"longmtbench\.json: .*question 1.*question is empty.*Fix"):
        load_records(path)


def test_distinct_options_and_real_questions_still_load():
    assert all(r.question.strip() for r in load_records(FIXTURES / "longmtbench.json"))
    assert all(len(set(r.options)) == len(r.options) for r in load_records(FIXTURES / "questions_32k.csv"))
