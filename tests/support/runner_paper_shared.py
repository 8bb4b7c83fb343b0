"""Helpers shared by tests/.../test_runner_paper.py and its model tier (not a test module)."""

from __future__ import annotations

import json

import pytest

from support.runs import (
    tiny_workspace,  # tests/ is on sys.path under pytest (tests/conftest.py)
)


@pytest.fixture(scope="module", name="workspace")
def workspace_fixture(tmp_path_factory):
    """A tiny saved Llama and a data file of three ordinary records, one very long and one with a tiny history."""
    from relaylens.datasets.synthetic import generate_records

    records = generate_records(n=2, seed=3, history_tokens=800)
    long = generate_records(n=1, seed=5, history_tokens=3000)[0]
    long["question_id"] = "the_long_one"
    short = json.loads(json.dumps(records[0]))
    short["question_id"] = "the_short_one"
    short["haystack_sessions"] = [[{"role": "user", "content": "Hi.", "has_answer": True}]]
    short["haystack_session_ids"] = short["haystack_session_ids"][:1]
    short["haystack_dates"] = short["haystack_dates"][:1]
    short["answer_session_ids"] = short["haystack_session_ids"]
    return tiny_workspace(tmp_path_factory.mktemp("paper_runner"), records + [long, short])
