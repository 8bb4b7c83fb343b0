"""Records and load_records: dataclass behaviour, format detection, lenient loading with a report."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from relaylens.datasets import detect_format, load_records, load_records_with_report
from relaylens.datasets.records import Record, Session, Turn, answer_to_str
from relaylens.errors import RecordError

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _record(**kw):
    base = dict(record_id="q", question="?", answers=("a",), question_type="single-session-user", question_date=None,
                sessions=(Session("s", None, (Turn("user", "hi"),)),), evidence_session_ids=(), is_abstention=False)
    return Record(**{**base, **kw})


def test_answer_to_str():
    assert [answer_to_str(v) for v in (3, 3.0, 2.5, "x")] == ["3", "3", "2.5", "x"]
    with pytest.raises(RecordError, match="not a bool.*Fix:"):  # a RelaylensError since issue 53 (was TypeError)
        answer_to_str(True)
    with pytest.raises(RecordError, match="finite number"):
        answer_to_str(float("nan"))


def test_record_is_frozen_and_hashable():
    rec = _record(meta={"k": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.question = "changed"
    assert hash(rec) == hash(_record(meta={"other": 2})) and rec == _record()
    assert not rec.has_evidence_annotations and not rec.is_multiple_choice and rec.cluster == "q"
    ev = _record(sessions=(Session("s", None, (Turn("assistant", "x", True),)),), cluster_id="c")
    assert ev.has_evidence_annotations and ev.has_turn_annotations and ev.cluster == "c"
    assert _record(sessions=(Session("s", None, (), True),)).has_evidence_annotations


@pytest.mark.parametrize("name,fmt,count", [
    ("longmemeval_small.json", "longmemeval", 4),
    ("longmemeval_small.jsonl", "longmemeval", 4),
    ("questions_32k.csv", "personamem", 3),
    ("longmtbench.json", "longmtbench", 2),
    ("longdialogue_qa_eng.jsonl", "infinitebench", 1),
    ("longbook_choice_eng.jsonl", "infinitebench", 2),
    ("longbook_qa_eng.jsonl", "infinitebench", 1),
])
def test_auto_detection_loads_every_format(name, fmt, count):
    assert detect_format(FIXTURES / name) == fmt
    records = load_records(FIXTURES / name)
    assert len(records) == count and all(r.source == fmt for r in records)
    assert load_records(FIXTURES / name, format=fmt) == records


def test_json_and_jsonl_give_the_same_records():
    assert load_records(FIXTURES / "longmemeval_small.json") == load_records(FIXTURES / "longmemeval_small.jsonl")


def test_extensionless_longmemeval_file(tmp_path):
    path = tmp_path / "longmemeval_s"  # the original release has no extension
    shutil.copy(FIXTURES / "longmemeval_small.json", path)
    assert len(load_records(path)) == 4


def test_lenient_load_reports_every_skip():
    path = FIXTURES / "longmemeval_malformed.jsonl"
    with pytest.raises(RecordError, match="haystack_dates"):
        load_records(path)
    with pytest.warns(UserWarning, match="skipped 3 malformed longmemeval"):
        records, report = load_records_with_report(path, lenient=True)
    assert [r.record_id for r in records] == ["e47becba"] and report.loaded == 1 and report.num_skipped == 3
    wheres = [w for w, _ in report.skipped]
    assert "gpt4_2655b836" in wheres[0] and "line 3" in wheres[1] and "7161e7e2" in wheres[2]
    reasons = [r for _, r in report.skipped]
    assert "haystack_dates[0]" in reasons[0] and "not valid JSON" in reasons[1]
    assert "answer_session_ids[0]" in reasons[2]
    assert "skipped 3" in report.summary()
    with pytest.warns(UserWarning):
        assert len(load_records(path, lenient=True)) == 1


def test_format_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_records(tmp_path / "missing.json")
    odd = tmp_path / "data.json"
    odd.write_text(json.dumps([{"foo": 1}]))
    with pytest.raises(ValueError, match="format="):
        load_records(odd)
    with pytest.raises(ValueError, match="unknown dataset format"):
        load_records(odd, format="no-such-format")
