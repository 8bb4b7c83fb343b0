"""Reliability of whole runs through the real CLI: SIGKILL at seeded random points then resume equals an
uninterrupted run, and the same command twice gives identical tables (timing columns excluded).

``tests/test_runner.py`` kills ``coordinate_ablation`` after two fixed delays; here the analysis is ``ordering``
(nine conditions, probes, ``random_order`` seeds), and each kill point is drawn from a seeded generator: wait until
a random number of units is committed, then a random fraction of one unit's measured duration.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from support.runs import (  # tests/ is on sys.path under pytest (tests/conftest.py)
    CLI_ENV,
    cli,
    committed_units,
    comparable_tables,
    tiny_workspace,
)

from relaylens.results.store import load_tables

ANALYSIS = "ordering"
RECORDS = 4
KILL_SEED = 20261129
TRIALS = 3


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    from relaylens.datasets.synthetic import generate_records

    return tiny_workspace(tmp_path_factory.mktemp("reliability-runs"),
                          generate_records(n=RECORDS, seed=3, history_tokens=800))


def _args(workspace, out):
    _, model_dir, data = workspace
    return ["run", ANALYSIS, "--model", model_dir, "--data", data, "--limit", RECORDS, "--budget", "0.4",
            "--max-new-tokens", "4", "--out", out]


def _run(workspace, out):
    return cli(*_args(workspace, out), timeout=300)


def _assert_same_tables(expected, actual):
    assert set(expected) == set(actual)
    for name in expected:
        pd.testing.assert_frame_equal(expected[name], actual[name], check_exact=True, obj=name)


@pytest.fixture(scope="module")
def reference(workspace):
    out = workspace[0] / "reference"
    _run(workspace, out)
    commits = sorted(p.stat().st_mtime for p in (out / "units").glob("*.json.gz"))
    unit_seconds = max(b - a for a, b in zip(commits, commits[1:]))  # wall time of the slowest unit after the first
    return out, comparable_tables(out), unit_seconds


def test_reference_run_is_complete(reference):
    out, tables, _ = reference
    assert committed_units(out) == RECORDS
    assert len(tables["answers"]) == RECORDS * 9  # four records x nine conditions (one selector, one budget)
    assert {"random_order(0)", "score_order", "reverse_order"} <= set(tables["answers"].condition)
    assert not tables["probes"].empty


def test_same_command_twice_gives_identical_tables(workspace, reference):
    out, expected, _ = reference
    again = workspace[0] / "again"
    _run(workspace, again)
    _assert_same_tables(expected, comparable_tables(again))
    # the raw probe values, not only their rounded summaries, agree bit for bit
    assert (load_tables(out)["probes"]["value"].to_numpy().tobytes()
            == load_tables(again)["probes"]["value"].to_numpy().tobytes())


def _kill_at_random_point(workspace, out, rng, unit_seconds):
    """Start the run, wait for ``k`` committed units (k random) plus a random fraction of a unit, SIGKILL it.
    Returns (units committed at the kill, whether the process was still running)."""
    wait_units, fraction = rng.randrange(RECORDS), rng.random()
    command = [sys.executable, "-m", "relaylens.cli", *map(str, _args(workspace, out))]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=CLI_ENV)
    deadline = time.monotonic() + 240
    try:
        while process.poll() is None and time.monotonic() < deadline:
            if committed_units(out) >= wait_units:
                break
            time.sleep(0.02)
        time.sleep(fraction * unit_seconds)
        running = process.poll() is None
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    return committed_units(out), running


def test_sigkill_at_random_points_then_resume_equals_uninterrupted(workspace, reference):
    _, expected, unit_seconds = reference
    rng = random.Random(KILL_SEED)
    interrupted = []
    for trial in range(TRIALS):
        out = workspace[0] / f"killed-{trial}"
        committed, running = _kill_at_random_point(workspace, out, rng, unit_seconds)
        if running:
            interrupted.append(committed)
            assert not (out / "consolidated.json").exists() or committed == RECORDS
        _run(workspace, out)  # resume: the same command
        assert committed_units(out) == RECORDS
        assert not list(out.rglob(".tmp-*")), "a temp file of the killed run survived the resume"
        _assert_same_tables(expected, comparable_tables(out))
    # the kill points are random but seeded: at least one must land while work was still pending
    assert any(c < RECORDS for c in interrupted), f"no trial interrupted the run (units at kill: {interrupted})"
