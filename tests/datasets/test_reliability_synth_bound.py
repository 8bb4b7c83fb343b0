"""Round 5 (issue 52, item 18): ``relaylens data synth --history-tokens`` is bounded: past the documented maximum
(:data:`relaylens.datasets.synthetic.MAX_HISTORY_TOKENS`, the rotary position limit 2**24) it is refused at once, in
one line, instead of running for ever while memory grows."""

from __future__ import annotations

import signal
from contextlib import contextmanager

import numpy as np
import pytest
from typer.testing import CliRunner

from relaylens.cli import app
from relaylens.datasets.synthetic import MAX_HISTORY_TOKENS, check_history_tokens, generate_records
from relaylens.errors import RelaylensError


@contextmanager
def within(seconds: int):
    """Fail (instead of hanging, as the generator did before the bound) when the block runs longer than ``seconds``."""
    def expire(*_):
        raise AssertionError(f"still running after {seconds} s: the request was not refused at once")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_the_maximum_is_the_rotary_position_limit():
    from relaylens.model.hf import POSITION_LIMIT

    assert MAX_HISTORY_TOKENS == POSITION_LIMIT == 2**24


@pytest.mark.parametrize("tokens", [MAX_HISTORY_TOKENS + 1, 100_000_000_000, 10**30])
def test_a_history_past_the_maximum_is_refused_at_once(tokens):
    with pytest.raises(RelaylensError, match=f"--history-tokens {tokens} is past the longest history .* Fix: pass "
                                             f"--history-tokens {MAX_HISTORY_TOKENS} or less"), within(20):
        generate_records(1, seed=0, history_tokens=tokens)


@pytest.mark.parametrize("tokens", [0, -5, 2.5, "2048", True, None])
def test_a_history_length_that_is_not_a_positive_whole_number_is_refused(tokens):
    with pytest.raises(RelaylensError, match="must be a positive whole number"):
        generate_records(1, seed=0, history_tokens=tokens)


def test_whole_numbers_of_any_integer_type_are_accepted():
    assert check_history_tokens(np.int64(700)) == 700 and isinstance(check_history_tokens(np.int64(700)), int)
    assert len(generate_records(1, seed=0, history_tokens=np.int64(700))) == 1


def test_the_synth_command_refuses_in_one_line(tmp_path):
    """Before: the command never ended (memory grew ~5 MB/s)."""
    out = tmp_path / "records.json"
    with within(20):
        result = CliRunner().invoke(app, ["data", "synth", "--history-tokens", "100000000000", "--out", str(out)],
                                    env={"COLUMNS": "400"})
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "past the longest history the generator builds" in result.output and not out.exists()
