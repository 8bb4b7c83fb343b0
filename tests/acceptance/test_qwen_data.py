"""The shipped Qwen-tokenizer datasets (``data/``) regenerate byte for byte from the command in ``data/README.md``
(issue 30). Runs where the Qwen2.5-0.5B tokenizer was pulled; the suite never downloads it."""

from __future__ import annotations

import hashlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from relaylens.model import embedded as models

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "data" / "README.md"


def _commands() -> list[tuple[str, list[str]]]:
    """``(file name, argv)`` of each ``relaylens data synth`` line of data/README.md."""
    out = []
    for line in README.read_text().splitlines():
        if line.startswith("relaylens data synth"):
            argv = shlex.split(line)
            out.append((Path(argv[argv.index("--out") + 1]).name, argv[1:argv.index("--out")]))
    return out


def _table() -> dict[str, str]:
    """``{file name: sha256}`` from the README's table."""
    return dict(re.findall(r"^\| `([^`]+\.json\.gz)` \|.*\| `([0-9a-f]{64})` \|$", README.read_text(), re.M))


def test_readme_lists_every_shipped_file_with_its_hash_and_command():
    shipped = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (ROOT / "data").glob("*.json.gz")}
    assert shipped and _table() == shipped
    assert sorted(name for name, _ in _commands()) == sorted(shipped)


@pytest.mark.parametrize("name", ["lme_qwen_2048.json.gz"])  # the others take the same path, 2-4x longer
def test_shipped_set_regenerates_byte_for_byte(name, tmp_path):
    if not models.is_pulled("qwen2.5-coder-0.5b-instruct"):
        pytest.skip("qwen2.5-coder-0.5b-instruct is not in the relaylens cache")
    argv = dict(_commands())[name]
    out = tmp_path / name
    subprocess.run([sys.executable, "-m", "relaylens.cli", *argv, "--out", str(out)], check=True, capture_output=True)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == _table()[name]
