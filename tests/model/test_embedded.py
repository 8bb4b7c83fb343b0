"""relaylens.model.embedded: the names it held before the split still import from it, as the very objects of their
homes (relaylens.model.catalogue, relaylens.model.pull, relaylens.fileio), and importing it imports no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import relaylens.model.pull as pulling
from relaylens.fileio import file_sha256
from relaylens.model import catalogue, embedded

ROOT = Path(__file__).resolve().parents[2]
# every public name relaylens.model.embedded defined or imported before it was split (issue 53, item 4)
FORMER = ["CACHE_DTYPES", "DEFAULT_MODEL", "EMBEDDED", "EmbeddedModel", "LICENSE_ENV", "MANIFEST_NAME", "ModelError",
          "PullError", "REFERENCE_NAME", "REFERENCE_TEXT", "RelaylensError", "VERIFIED_NAME", "cache_dir", "cache_for",
          "download_wheels", "is_pulled", "load_gguf", "model_dir", "pull", "reference_logits", "sha256_file",
          "verify_cached", "weights_sha256"]


def test_every_former_name_is_the_object_of_its_home():
    assert sorted(embedded.__all__) == sorted(FORMER)
    for name in FORMER:
        home = next((m for m in (catalogue, pulling) if name in getattr(m, "__all__", ())), None)
        if home is not None:
            assert getattr(embedded, name) is getattr(home, name), name
    assert embedded.sha256_file is file_sha256  # one SHA-256 helper (relaylens.fileio)
    assert embedded.PullError.__module__ == "relaylens.model.pull"


def test_importing_it_imports_no_torch():
    code = ("import sys; from relaylens.model.embedded import DEFAULT_MODEL, pull\n"
            "print([m for m in ('torch', 'transformers', 'pandas') if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=True)
    assert out.stdout.strip() == "[]"
