"""Dataset readers against hand-written fixtures in the real schemas, and malformed variants of each."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import pytest

from relaylens.datasets import load_records
from relaylens.datasets.infinitebench import chunk_paragraphs
from relaylens.datasets.longmtbench import split_exchange
from relaylens.datasets.records import Turn
from relaylens.errors import RecordError

FIXTURES = Path(__file__).parents[1] / "fixtures"


# ---------------------------------------------------------------- LongMemEval

@pytest.fixture(scope="module")
def lme():
    return {r.record_id: r for r in load_records(FIXTURES / "longmemeval_small.json")}


def test_longmemeval_fields(lme):
    ssu = lme["e47becba"]
    assert ssu.answers == ("Business Administration",) and ssu.question_date == "2023/05/30 (Tue) 23:40"
    assert [s.session_id for s in ssu.sessions] == ["sharegpt_yZ3VdgN_0", "answer_280352e9", "85a1be56_1"]
    assert [s.is_evidence for s in ssu.sessions] == [False, True, False]
    assert [t.has_answer for t in ssu.sessions[1].turns] == [True, False, False, False]
    assert not ssu.is_abstention and ssu.cluster_id is None and ssu.question_type == "single-session-user"


def test_longmemeval_numeric_answer_and_unsorted_oracle(lme):
    ms = lme["gpt4_2655b836"]
    assert ms.answers == ("5",) and ms.raw_answer == 5 and isinstance(ms.raw_answer, int)
    assert ms.evidence_session_ids == ("answer_4be1b6b4_1", "answer_4be1b6b4_2")
    assert [s.session_id for s in ms.sessions][0] == "answer_4be1b6b4_2"  # file order kept; rendering sorts


def test_longmemeval_abstention_and_assistant_evidence(lme):
    assert lme["c4ab1a2d_abs"].is_abstention and lme["c4ab1a2d_abs"].question_type == "single-session-user"
    ssa = lme["7161e7e2"]
    assert [(t.role, t.has_answer) for t in ssa.sessions[0].turns] == [("user", False), ("assistant", True)]
    assert ssa.sessions[1].turns[0].content == 'What is a "mutex"? \u00e9l\u00e8ve'


def _mutations():
    def drop(key):
        return lambda r: r.pop(key)

    def setv(path, value):
        def f(r):
            node = r
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = value
        return f

    return [
        ("question_id", drop("question_id")),
        ("question_type", setv(["question_type"], "open-domain")),
        ("'answer'", setv(["answer"], ["a", "b"])),
        ("'answer'", setv(["answer"], None)),
        ("'answer'", setv(["answer"], True)),
        ("question_date", setv(["question_date"], "2023-05-30 23:40")),
        ("haystack_dates[2]", setv(["haystack_dates", 2], "yesterday")),
        ("parallel lists", lambda r: r["haystack_dates"].pop()),
        ("answer_session_ids[0]", setv(["answer_session_ids"], ["answer_ffffffff"])),
        ("haystack_sessions[1][0].role", setv(["haystack_sessions", 1, 0, "role"], "bot")),
        ("haystack_sessions[1][1].content", setv(["haystack_sessions", 1, 1, "content"], 42)),
        ("haystack_sessions[1][0].has_answer", setv(["haystack_sessions", 1, 0, "has_answer"], "yes")),
        ("haystack_sessions[0]", setv(["haystack_sessions", 0], {"role": "user"})),
        ("haystack_session_ids[0]", setv(["haystack_session_ids", 0], 7)),
    ]


@pytest.mark.parametrize("field,mutate", _mutations(), ids=[f"{i}-{m[0]}" for i, m in enumerate(_mutations())])
def test_longmemeval_malformed_records_name_file_record_field_and_fix(tmp_path, field, mutate):
    data = json.loads((FIXTURES / "longmemeval_small.json").read_text())
    bad = copy.deepcopy(data[0])
    mutate(bad)
    path = tmp_path / "lme.json"
    path.write_text(json.dumps([data[1], bad]))
    with pytest.raises(RecordError) as err:
        load_records(path, format="longmemeval")
    msg = str(err.value)
    assert str(path) in msg and field in msg and "Fix:" in msg
    assert ("e47becba" in msg) or ("item 1" in msg)


# ---------------------------------------------------------------- PersonaMem

@pytest.fixture(scope="module")
def persona():
    return load_records(FIXTURES / "questions_32k.csv")


def test_personamem_context_cut_sessions_and_options(persona):
    first, second, third = persona
    assert first.question_type == "track_full_preference_evolution" and first.cluster_id == "7"
    assert first.options[2].startswith("(c) A pilates") and first.correct_option == "c"
    assert first.answers == (first.options[2],) and first.raw_answer == "(c)"
    assert [len(s.turns) for s in first.sessions] == [5, 3]  # cut at 8 messages, split at system messages
    assert first.sessions[1].turns[0].role == "system" and first.sessions[0].turns[1].content.startswith("User: ")
    assert second.question_type == "recall_user_shared_facts"  # alias normalised
    assert second.num_turns == 5 and second.correct_option == "a"
    assert third.question_type == "generalize_to_new_scenarios"
    assert third.sessions[0].turns[1].content.startswith("Patient:")
    assert first.meta["distance_to_ref_proportion_in_context"] == "45.20%" and first.meta["topic"] == "exercise"
    assert not first.has_evidence_annotations and first.question_date is None


def test_personamem_old_columns_and_explicit_contexts(tmp_path):
    recs = load_records(FIXTURES / "personamem_old_questions.csv", format="personamem",
                        contexts_path=FIXTURES / "shared_contexts_32k.jsonl")
    assert recs[0].question == "What kind of exercise should I do this week?"
    assert recs[0].cluster_id == recs[0].meta["shared_context_id"]  # no persona_id column
    with pytest.raises(FileNotFoundError, match="contexts_path="):
        load_records(FIXTURES / "personamem_old_questions.csv", format="personamem")


def _persona_csv(tmp_path, **changes):
    rows = list(csv.DictReader(open(FIXTURES / "questions_32k.csv", newline="")))
    rows[0].update(changes)
    path = tmp_path / "questions_32k.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (tmp_path / "shared_contexts_32k.jsonl").write_text((FIXTURES / "shared_contexts_32k.jsonl").read_text())
    return path


@pytest.mark.parametrize("changes,field", [
    ({"all_options": "(a) one, (b) two"}, "all_options"),
    ({"all_options": "['(a) only one']"}, "all_options"),
    ({"correct_answer": "(e)"}, "correct_answer"),
    ({"question_type": "guess_the_weather"}, "question_type"),
    ({"shared_context_id": "0" * 64}, "shared_context_id"),
    ({"end_index_in_shared_context": "99"}, "end_index_in_shared_context"),
    ({"end_index_in_shared_context": "many"}, "end_index_in_shared_context"),
    ({"user_question_or_message": "  "}, "user_question_or_message"),
])
def test_personamem_malformed_rows(tmp_path, changes, field):
    path = _persona_csv(tmp_path, **changes)
    with pytest.raises(RecordError, match=f"field '{field}'") as err:
        load_records(path)
    assert "3f2a9c1e" in str(err.value) and "Fix:" in str(err.value)
    with pytest.warns(UserWarning):
        assert len(load_records(path, lenient=True)) == 2


def test_personamem_missing_column(tmp_path):
    path = tmp_path / "questions_32k.csv"
    path.write_text("question_id,correct_answer,shared_context_id\nx,(a),y\n")
    with pytest.raises(RecordError, match="missing"):
        load_records(path, format="personamem")


# ---------------------------------------------------------------- Long-MT-Bench+

def test_split_exchange_forms():
    assert split_exchange("<Turn 3>: [human]: Hi\n[bot]: Yo") == (Turn("user", "Hi"), Turn("assistant", "Yo"))
    assert split_exchange("[human]: Hi\n[bot]: Yo") == (Turn("user", "Hi"), Turn("assistant", "Yo"))
    assert split_exchange("[human]: only a question") == (Turn("user", "only a question"),)
    assert split_exchange("plain text") == (Turn("user", "plain text"),)


def test_longmtbench_json_and_parquet(tmp_path):
    recs = load_records(FIXTURES / "longmtbench.json")
    assert [r.record_id for r in recs] == ["3_q0", "3_q1"] and {r.cluster_id for r in recs} == {"3"}
    assert [len(s.turns) for s in recs[0].sessions] == [4, 3]
    assert recs[0].sessions[0].turns[1].content == "Buds wake, the rivers sing."
    assert recs[1].answers == ("Canberra, the capital of Australia.",) and not recs[0].has_evidence_annotations
    pd = pytest.importorskip("pandas")
    path = tmp_path / "test-00000-of-00001.parquet"
    pd.DataFrame(json.loads((FIXTURES / "longmtbench.json").read_text())).to_parquet(path)
    assert load_records(path) == recs


def test_unreadable_parquet_and_csv_are_record_errors(tmp_path):
    """pyarrow's and pandas's ValueErrors on a damaged file are bad input: one RecordError naming the file and the fix
    (the command line prints it as one line; a bare ValueError would be reported as a bug)."""
    pytest.importorskip("pandas")
    parquet = tmp_path / "test-00000-of-00001.parquet"
    parquet.write_bytes(b"not a parquet file")
    with pytest.raises(RecordError, match=r"not a readable parquet file \(ArrowInvalid: .*Fix: "):
        load_records(parquet)
    csv_path = tmp_path / "questions_32k.csv"
    csv_path.write_text('question_id,"unterminated\n', encoding="utf-8")
    with pytest.raises(RecordError, match=r"not a readable CSV file \(ParserError: .*Fix: "):
        load_records(csv_path, format="personamem")
    csv_path.write_text("", encoding="utf-8")
    with pytest.raises(RecordError, match=r"not a readable CSV file \(EmptyDataError: .*Fix: "):
        load_records(csv_path, format="personamem")


def test_longmtbench_malformed(tmp_path):
    data = json.loads((FIXTURES / "longmtbench.json").read_text())
    data[0]["answers"] = data[0]["answers"][:1]
    path = tmp_path / "mtb.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="field 'answers'.*2 questions, 1 answers"):
        load_records(path, format="longmtbench")
    with pytest.warns(UserWarning):
        assert load_records(path, format="longmtbench", lenient=True) == []


# ---------------------------------------------------------------- InfiniteBench

def test_infinitebench_tasks():
    (dia,) = load_records(FIXTURES / "longdialogue_qa_eng.jsonl")
    assert dia.answers == ("PETER",) and "$$MASK$$" in dia.question and dia.question_type == "longdialogue_qa_eng"
    assert dia.sessions[0].turns[0].role == "document" and dia.meta["task"] == "longdialogue_qa_eng"
    choice = load_records(FIXTURES / "longbook_choice_eng.jsonl")
    assert choice[0].options == ("A. Along the river", "B. Through the garden", "C. Into town", "D. Up the hill")
    assert [c.correct_option for c in choice] == ["b", "a"] and choice[0].cluster_id == choice[1].cluster_id
    (qa,) = load_records(FIXTURES / "longbook_qa_eng.jsonl")
    assert qa.answers == ("Elizabeth",
                          "Elizabeth Bennet") and qa.options is None and qa.record_id == "longbook_qa_eng_7"
    text = "\n\n".join(t.content for t in qa.sessions[0].turns)
    assert text == json.loads((FIXTURES / "longbook_qa_eng.jsonl").read_text())["context"]  # chunks lose nothing
    assert len(qa.sessions[0].turns) > 1 and all(len(t.content) <= 2000 for t in qa.sessions[0].turns)


def test_chunking_keeps_long_paragraphs_whole():
    assert chunk_paragraphs("x" * 50 + "\n\nb", max_chars=10) == ("x" * 50, "b")
    assert chunk_paragraphs("a\n\nb\n\nc", max_chars=4) == ("a\n\nb", "c")


def test_infinitebench_task_inference_and_errors(tmp_path):
    src = json.loads((FIXTURES / "longbook_choice_eng.jsonl").read_text().splitlines()[0])
    path = tmp_path / "mystery.jsonl"
    path.write_text(json.dumps(src) + "\n")
    assert load_records(path, format="infinitebench")[0].question_type == "longbook_choice_eng"  # has options
    qa = dict(src, options=[])
    path.write_text(json.dumps(qa) + "\n")
    with pytest.raises(RecordError, match="task="):
        load_records(path, format="infinitebench")
    assert load_records(path, format="infinitebench", task="longbook_qa_eng")[0].options is None
    path.write_text(json.dumps(dict(src, answer=["Nowhere"])) + "\n")
    with pytest.raises(RecordError, match="field 'answer'"):
        load_records(path, format="infinitebench")
    path.write_text(json.dumps(dict(src, context=None)) + "\n")
    with pytest.raises(RecordError, match="field 'context'"):
        load_records(path, format="infinitebench")
    with pytest.raises(ValueError, match="unknown InfiniteBench task"):
        load_records(path, format="infinitebench", task="passkey")
