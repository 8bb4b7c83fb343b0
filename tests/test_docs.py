"""The runnable examples in public docstrings must run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["relaylens.selection", "relaylens.geometry", "relaylens.conditions", "relaylens.testing", "relaylens.bands",
           "relaylens.attention", "relaylens.generation", "relaylens.experiments", "relaylens.probes", "relaylens.prefill",
           "relaylens.results", "relaylens.scoring", "relaylens.summaries", "relaylens.shards", "relaylens.placement",
           "relaylens.presets", "relaylens.rejudge", "relaylens.agreement", "relaylens.retention", "relaylens.scopes",
           "relaylens.layer_sweep", "relaylens.launch", "relaylens.sweep", "relaylens.attribution", "relaylens.views"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no docstring example"
    assert result.failed == 0
