"""Round 5 (issue 52, item 19): the probe registry checks what a kind's :class:`ProbeTables` hold -- the columns and
value kinds of its probe frames and score rows, the type of its view -- and a malformed part fails at once naming the
probe kind and the field, instead of a ``TypeError`` / ``KeyError`` in the store after the unit's decoding."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pytest

from relaylens.errors import RelaylensError
from relaylens.probes.registry import ProbeTables, run_probes

SCORE = {"condition": "relay", "metric": "kept", "value": 3.0}
ROW = {"layer": 0, "head": 1, "metric": "kept", "value": 0.5, "condition": "relay", "probe_point": "question_final",
       "source": "toy"}


@dataclass(frozen=True)
class Returns:
    tables: ProbeTables
    name: str = "toy_kind"

    def enabled(self, spec, config):
        return True

    def run(self, unit):
        return self.tables


def _frame(**change) -> pd.DataFrame:
    row = {k: v for k, v in {**ROW, **change}.items() if v is not _DROP}
    return pd.DataFrame([row])


_DROP = object()
MALFORMED = {
    "score without value": (ProbeTables(scores=({"condition": "relay", "metric": "kept"},)), "'value'"),
    "score value as text": (ProbeTables(scores=({**SCORE, "value": "3"},)), "field 'value' holds '3'"),
    "score value as bool": (ProbeTables(scores=({**SCORE, "value": True},)), "field 'value' holds True"),
    "score metric as number": (ProbeTables(scores=({**SCORE, "metric": 7},)), "field 'metric' holds 7"),
    "score extra field": (ProbeTables(scores=({**SCORE, "layer": 1},)), "unexpected fields ['layer']"),
    "score not a mapping": (ProbeTables(scores=(("relay", "kept", 3.0),)), "expected a mapping"),
    "scores as one mapping": (ProbeTables(scores=SCORE), "scores as dict, expected a tuple"),
    "probe frame missing a column": (ProbeTables(probes=(_frame(source=_DROP),)), "missing columns ['source']"),
    "probe frame extra column": (ProbeTables(probes=(_frame(extra=1),)), "unexpected columns ['extra']"),
    "probe layer as float": (ProbeTables(probes=(_frame(layer=0.5),)), "field 'layer' holds 0.5"),
    "probe head as text": (ProbeTables(probes=(_frame(head="1"),)), "field 'head' holds '1'"),
    "probe value as text": (ProbeTables(probes=(_frame(value="x"),)), "field 'value' holds 'x'"),
    "probe part not a frame": (ProbeTables(probes=(ROW,)), "probes part 0 as dict, expected a pandas DataFrame"),
    "probes as one frame": (ProbeTables(probes=_frame()), "probes as DataFrame, expected a tuple"),
    "view as a list": (ProbeTables(view=[1, 2]), "a view as list, expected a dict or None"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_part_fails_naming_the_kind_and_the_field(case):
    tables, names = MALFORMED[case]
    with pytest.raises(RelaylensError) as err:
        run_probes(None, [Returns(tables)])
    message = str(err.value)
    assert message.startswith("probe kind 'toy_kind' returned ") and names in message and "Fix:" in message, message


def test_well_formed_tables_pass_unchanged():
    tables = ProbeTables(probes=(_frame(), _frame(value=float("nan"), layer=1)), scores=(SCORE, {**SCORE,
                         "value": None}), view={"record_id": "r"})
    assert run_probes(None, [Returns(tables)]) == [tables]
    assert run_probes(None, [Returns(ProbeTables())]) == [ProbeTables()]
