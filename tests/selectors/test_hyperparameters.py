"""Issue 28 item 19: every hyperparameter of every selector is checked for its type (and seeds for their range) when
the selector is built, so ``--selector random:seed=1.5`` fails when the spec is parsed, never after the prefill."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from relaylens.errors import RelaylensError
from relaylens.experiments.specs import ExperimentSpec, parse_selector_arg
from relaylens.selectors import REGISTRY, make_selector

#: One wrong value per declared type (the plain types a selector hyperparameter can have).
WRONG = {bool: [1, "yes", None], int: [1.5, True, "3", math.nan, None], float: [math.nan, math.inf, "x", False, None],
         str: [3, True, None]}


def _cases():
    for name, cls in sorted(REGISTRY.items()):
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            allowed = typing.get_args(hints[field.name]) or (hints[field.name],)  # int | None -> (int, NoneType)
            kinds = [k for k in allowed if k in WRONG]
            if not kinds:  # captured data (FINCH's question attention)
                continue
            for value in WRONG[kinds[0]]:
                if value is None and type(None) in allowed:
                    continue
                yield pytest.param(name, field.name, value, id=f"{name}-{field.name}={value!r}")


@pytest.mark.parametrize(("name", "field", "value"), list(_cases()))
def test_a_wrong_type_is_refused_when_the_selector_is_built(name, field, value):
    with pytest.raises(RelaylensError, match=rf"selector {name!r}: {field}=.*must be .*Fix: e\.g\. {name}:{field}="):
        make_selector(name, **{field: value})


def test_every_selector_declares_hyperparameters_that_are_checked():
    assert len(list(_cases())) > 60, "every selector's hyperparameters are covered"


@pytest.mark.parametrize("text", ["random:seed=1.5", "cam:seed=1.5", "random:seed=-1", "cam:seed=-2",
                                  f"random:seed={2**63}", "random:shared=1", "bm25:k1=nan", "bm25:b=1.5", "bm25:k1=-1",
                                  "pyramidkv:beta=inf", "adakv:floor_alpha=nan", "h2o:recent_ratio=inf",
                                  "snapkv:window=8.0", "streaming:n_sink=true"])
def test_bad_selector_arguments_fail_when_the_spec_is_parsed(text):
    name, options = parse_selector_arg(text)
    with pytest.raises(RelaylensError, match=rf"{name}.*Fix"):
        ExperimentSpec("bad", selectors=(name,), budgets=(0.1,), conditions=("original",),
                       selector_options={name: options})


def test_valid_values_of_every_type_still_build():
    assert make_selector("random", seed=2**63 - 1, shared=True).seed == 2**63 - 1
    assert make_selector("bm25", k1=2, b=0).k1 == 2  # a whole number is a fine float
    assert make_selector("finch", chunk_size=None).chunk_size is None
    assert make_selector("h2o", recent_size=None, recent_ratio=1).recent_ratio == 1
    assert make_selector("snapkv", pooling="none").pooling == "none"
