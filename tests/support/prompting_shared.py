"""Helpers shared by tests/.../test_prompting.py and its model tier (not a test module)."""

from __future__ import annotations

import pytest

from relaylens.testing import tiny_tokenizer

MODES = ("chat", "completion")


@pytest.fixture(scope="module", name="tok")
def tok_fixture():
    return tiny_tokenizer()
