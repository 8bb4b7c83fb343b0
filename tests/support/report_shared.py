"""Helpers shared by tests/.../test_report.py and its browser tier (not a test module)."""

from __future__ import annotations

import pytest

from relaylens.reporting import report
from relaylens.results.tables import example_tables

LAYERS, HEADS = 4, 2  # the constructed tables' and views' layers and heads (test_report.py and its browser tier)
MANIFEST = {"analysis": "evidence_reading", "config": {"spec": {"figures": ["figure6"]}},
            "model": {"spec": "https://example.org/tiny-model", "weights_hash": "ab" * 32},
            "dataset": {"path": "/data/lme.json", "sha256": "cd" * 32}, "created_at": "2026-01-01T00:00:00+00:00"}


@pytest.fixture(scope="module", name="tables")
def tables_fixture():
    t = example_tables(records=3, selectors=("snapkv",), budgets=(0.1,), layers=LAYERS, heads=HEADS,
                         conditions=("original", "half_gap", "relay"))
    t["answers"].loc[0, "answer"] = "<script>alert('x')</script> see http://evil.example/x"
    return t


@pytest.fixture(scope="module", name="html")
def html_fixture(tables):
    return report.render_report(tables, MANIFEST)

# ------------------------------------------------------------------------------------------------ token view


def views(records: int = 3, tokens: int = 300) -> list[dict]:
    from relaylens.reporting.token_view import example_view

    return [example_view(tokens=tokens, layers=LAYERS) | {"record_id": f"r{i}", "order": i} for i in range(records)]
