"""Round 5 (issue 52, item 23): ``project.license`` is an SPDX expression string (PEP 639), not the deprecated TOML
table, and the build backend the project asks for supports it: setuptools reads it without a deprecation warning and
writes ``License-Expression`` metadata. (The wheel itself is built by tests/test_wheel.py.)"""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_license_is_an_spdx_string_and_setuptools_is_new_enough():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    assert project["project"]["license"] == "Apache-2.0"
    requirement = next(r for r in project["build-system"]["requires"] if r.startswith("setuptools"))
    floor = re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", requirement)
    assert floor and int(floor[1]) >= 77, f"{requirement}: SPDX license strings need setuptools >= 77"


def test_setuptools_reads_the_license_without_a_deprecation_warning():
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    messages = [str(w.message) for w in caught if "license" in str(w.message).lower()]
    assert messages == [], messages[0][:300] if messages else ""
    assert dist.metadata.license_expression == "Apache-2.0"
