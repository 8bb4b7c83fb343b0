"""InfiniteBench prompts: the benchmark's own task templates, split at the context; the bundled generated sample."""

from __future__ import annotations

import json

import pytest

from relaylens.datasets import load_records
from relaylens.datasets.prompt_templates import infinitebench_layout
from relaylens.datasets.prompting import render_prompt
from relaylens.datasets.synthetic_infinitebench import (
    bundled_infinitebench_path,
    infinitebench_rows,
    write_infinitebench_sample,
)
from relaylens.errors import RecordError
from relaylens.testing import tiny_tokenizer

BOOK = "First paragraph.\n\nSecond one, longer.\n\nThird."
ROWS = [
    {"id": 0, "context": "ANN: Hi.\n\n$$MASK$$: Hello.", "input": "", "answer": ["BOB"], "options": [],
     "task": "longdialogue_qa_eng"},
    {"id": 1, "context": BOOK, "input": "Where?", "answer": ["Oslo"], "options": ["Rome", "Oslo", "Bern", "Riga"],
     "task": "longbook_choice_eng"},
    {"id": 2, "context": BOOK, "input": "Who?", "answer": ["Ann"], "options": [], "task": "longbook_qa_eng"},
]
ROWS_BY_TASK = {r["task"]: r for r in ROWS}
# The upstream templates (OpenBMB/InfiniteBench src/prompt.py) filled in by hand for ROWS.
EXPECTED = {
    ("longdialogue_qa_eng", "chat"): (
        'Below is a dialogue script where one random occurrence of a character name is replaced with "$$MASK$$", and '
        'you should try to guess who that character is.\n\nThe dialogue:\n\n---\n\nANN: Hi.\n\n$$MASK$$: Hello.',
        '\n\n---\n\nEnd of dialogue.\n\nWhich character is most likely "$$MASK$$"? Just say the name used by the '
        'scriptwriter (before the colon marks) of one single character and nothing else.'),
    ("longdialogue_qa_eng", "completion"): (
        'Below is a dialogue script where one random occurrence of a character name is replaced with "$$MASK$$", and '
        'you should try to guess who that character is.\n\nANN: Hi.\n\n$$MASK$$: Hello.',
        '\n\nThe name that has been replaced with $$MASK$$ is likely'),
    ("longbook_choice_eng", "chat"): (
        "Read the book and answer the question.\n\n" + BOOK,
        "\n\nQuestion: Where?\n\nOnly one of the following options is correct, tell me the answer using one single "
        "letter (A, B, C, or D). Don't say anything else.\nA. Rome\nB. Oslo\nC. Bern\nD. Riga"),
    ("longbook_choice_eng", "completion"): (
        "Read the book and answer the question.\n\n" + BOOK,
        "\n\nQuestion: Where?\nA. Rome\nB. Oslo\nC. Bern\nD. Riga\n\nThe letter of the correct answer is"),
    ("longbook_qa_eng", "chat"): (
        "Read the book below and answer a question.\n\n" + BOOK, "\n\nQuestion: Who?\n\nBe very concise."),
    ("longbook_qa_eng", "completion"): (
        "Read the book and answer the question. Be very concise in your answer.\n\n" + BOOK,
        "\n\nQuestion: Who?\nAnswer:"),
}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = tmp_path_factory.mktemp("ib") / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return {r.question_type: r for r in load_records(path)}


@pytest.mark.parametrize("task,mode", sorted(EXPECTED))
def test_layout_is_the_upstream_template(records, task, mode):
    layout = infinitebench_layout(records[task], mode)
    history, question = EXPECTED[(task, mode)]
    assert layout.history_text == history
    assert layout.text[layout.question_start:] == question
    _, start, end = layout.sessions[0]
    context = "\n\n".join(t.content for t in records[task].sessions[0].turns)
    assert layout.text[start:end] == context == ROWS_BY_TASK[task]["context"]
    assert [layout.text[a:b] for _, _, a, b in layout.turns] == [t.content for t in records[task].sessions[0].turns]


@pytest.mark.parametrize("mode", ["chat", "completion"])
def test_rendered_tokens_split_at_the_context(records, mode):
    tok = tiny_tokenizer()
    for task, record in records.items():
        prompt = render_prompt(record, tok, mode=mode)
        history, question = EXPECTED[(task, mode)]
        full = prompt.history_text + prompt.question_text
        at = full.index(history + question)  # the template text, contiguous (chat: inside the chat template)
        # split at the context's end (a merged token at most)
        assert 0 <= at + len(history) - len(prompt.history_text) < 4
        ids = tok(full, add_special_tokens=False)["input_ids"]
        assert prompt.history_ids.tolist() + prompt.question_ids.tolist() == ids
        assert "### Session" not in full and "History Chats" not in full  # no LongMemEval reader wrapping
        assert len(prompt.turns) == len(record.sessions[0].turns)


def test_choice_needs_four_options(tmp_path):
    row = dict(ROWS[1], options=["Rome", "Oslo", "Bern"], answer=["Oslo"])
    path = tmp_path / "three.jsonl"
    path.write_text(json.dumps(row) + "\n")
    record = load_records(path)[0]
    with pytest.raises(RecordError, match="4 options"):
        infinitebench_layout(record, "chat")


def test_bad_task_key_is_refused(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(dict(ROWS[2], task="longbook_sum_eng")) + "\n")
    with pytest.raises(RecordError, match="task"):
        load_records(path)


def test_bundled_sample_is_the_generator_output(tmp_path):
    fresh = write_infinitebench_sample(tmp_path / "s.jsonl")
    assert fresh.read_bytes() == bundled_infinitebench_path().read_bytes()
    records = load_records(bundled_infinitebench_path())
    assert [r.question_type for r in records[:3]] == ["longdialogue_qa_eng", "longbook_choice_eng", "longbook_qa_eng"]
    assert len(records) == 9 and all(r.source == "infinitebench" for r in records)
    dia = records[0]
    assert dia.answers[0].isupper() and "$$MASK$$" in dia.sessions[0].turns[0].content + "".join(
        t.content for t in dia.sessions[0].turns)
    choice = records[1]
    assert choice.correct_option in "abcd" and len(choice.options) == 4
    assert choice.answers[0] in " ".join(t.content for t in choice.sessions[0].turns)
    assert infinitebench_rows(seed=1, per_task=1) != infinitebench_rows(seed=0, per_task=1)
