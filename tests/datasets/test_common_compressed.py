"""Compressed dataset files: a ``.json.gz`` reads exactly like the plain file, and the generator writes the same
compressed bytes on every run (no name or time in the gzip header)."""

from __future__ import annotations

import gzip

import pytest

from relaylens.datasets import detect_format, load_records
from relaylens.datasets.synthetic import generate_records, write_records


@pytest.fixture(scope="module")
def records():
    return generate_records(4, seed=3, history_tokens=1200)


def test_gz_reads_like_the_plain_file(tmp_path, records):
    plain = write_records(records, tmp_path / "lme.json")
    packed = write_records(records, tmp_path / "lme.json.gz")
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
    assert detect_format(packed) == detect_format(plain) == "longmemeval"
    assert load_records(packed) == load_records(plain)


def test_gz_jsonl_and_other_formats_sniff_through_the_compression(tmp_path):
    from relaylens.datasets.synthetic_infinitebench import bundled_infinitebench_path

    source = bundled_infinitebench_path().read_bytes()
    packed = tmp_path / "sample_infinitebench.jsonl.gz"
    packed.write_bytes(gzip.compress(source))
    assert detect_format(packed) == "infinitebench"
    assert len(load_records(packed)) == len(load_records(bundled_infinitebench_path()))


def test_compressed_output_is_the_same_bytes_every_time(tmp_path, records):
    first = write_records(records, tmp_path / "a.json.gz").read_bytes()
    second = write_records(records, tmp_path / "b.json.gz").read_bytes()
    assert first == second and first[4:8] == b"\0\0\0\0"  # gzip MTIME field zero
