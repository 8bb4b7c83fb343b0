"""One way to open a run: every runner opens its run directory with this recipe (``relaylens run ANALYSIS`` through
:func:`relaylens.experiments.runner.run_analysis`, ``learned_geometry`` through
:func:`relaylens.experiments.learned_run.run_learned_geometry`), so their manifests cannot drift apart.

1. :func:`open_run`: the shard (``--shard auto``: the launcher's, torchrun / accelerate / SLURM; or ``--shard I/N``),
   the placement, the records (the analysis's own sample or ``--data``, the first ``limit``, this shard's share),
   the run (or shard) directory, the model and tokenizer, the prompt mode ``auto`` resolved, the rotary factors.
2. :meth:`OpenedRun.with_manifest`: the manifest (spec, run settings, placement, extra sections, rope summary, model
   fingerprints, dataset hash, shard, plan), with every ``learned:RUN_DIR`` condition pinned and checked.
3. :meth:`OpenedRun.session`: the run directory prepared and locked, the judge built (a bad judge setting fails before
   the manifest is written), the store created or resumed.

The config must have passed :func:`relaylens.experiments.config.check_config` (the runners call it first).

Example (the shape of every runner):
    >>> opened = open_run(spec, config, (model, tokenizer))  # doctest: +SKIP
    >>> opened = opened.with_manifest(analysis_plan(opened))  # doctest: +SKIP
    >>> with opened.session() as session:  # doctest: +SKIP
    ...     session.store.consolidate()
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from relaylens.errors import RelaylensError
from relaylens.experiments.config import RunConfig, run_records
from relaylens.experiments.judges import make_judge
from relaylens.experiments.launch import detect_shard, shard_dir
from relaylens.experiments.learned import check_learned_conditions
from relaylens.experiments.specs import ExperimentSpec
from relaylens.generation.rows import decoding_path
from relaylens.generation.settings import resolve_decoding
from relaylens.geometry.rotary import RotaryFactors
from relaylens.model import loading  # loading.load_model looked up at call time: tests stand in a fake loader
from relaylens.model.hf import rope_summary
from relaylens.model.placement import machine_stamp
from relaylens.model.random_specs import refuse_random
from relaylens.model.upcast import model_upcast
from relaylens.results.locks import run_lock
from relaylens.results.manifest import ABSENT_MEANS, manifest_section
from relaylens.results.shards import parse_shard, shard_records
from relaylens.results.store import RunStore, build_manifest, prepare_run_dir
from relaylens.scoring.judge import redact_url

__all__ = ["OpenedRun", "RunSession", "analysis_plan", "open_run", "previous_manifest"]

#: run settings that never change results, left out of the manifest (so a resumed run may change them)
UNRECORDED = ("out", "force", "shard", "retry_skipped", "batch_rows", "view_records")


@dataclass(frozen=True)
class RunSession:
    """A locked run directory: its store, the run's judge (None without one) and, when asked for, the manifest the
    directory held before this run (None: a new directory, or one the store will refuse)."""

    store: RunStore
    judge: Any
    previous: dict | None = None


@dataclass(frozen=True)
class OpenedRun:
    """A run ready to start: its records, model and directory; ``manifest`` once :meth:`with_manifest` built it."""

    spec: ExperimentSpec  # prompt mode resolved; learned conditions pinned once the manifest is built
    config: RunConfig
    records: list  # the Records this run (or shard) owns, in file order
    data_path: Path
    out: Path  # the run directory, or this shard's directory inside it
    shard: tuple[int, int] | None
    placement: Any  # relaylens.model.placement.Placement
    model: Any
    tokenizer: Any
    factors: RotaryFactors
    manifest: dict | None = None

    def upcast(self) -> tuple[bool, str]:
        """``(applies, why)``: whether this run computes its bfloat16 matrix products with float32 kernels
        (:mod:`relaylens.model.upcast`: a bfloat16 model on a CPU without bfloat16 hardware; never under a compile
        backend, whose graphs the block would not reach)."""
        applies, why = model_upcast(self.model)
        if applies and self.config.compile_backend is not None:
            return False, f"not under --compile-backend {self.config.compile_backend}"
        return applies, why

    @property
    def record_ids(self) -> list[str]:
        """The ids of :attr:`records`, in order."""
        return [r.record_id for r in self.records]

    def with_manifest(self, plan: dict, sections: dict | None = None, placement: bool = True,
                      judge_url: bool = True) -> OpenedRun:
        """This run with its manifest: config sections ``spec``, ``run`` (the config without :data:`UNRECORDED`,
        the judge URL without credentials), ``placement`` (the device kind, not its index: shards on ``cuda:0`` and
        ``cuda:1`` still agree), ``decoding`` (what a decoding step runs and why, with the placement), ``sections``
        (e.g. ``learn``) and ``rope``; the ``plan`` (``record_ids`` at least).
        ``placement=False`` / ``judge_url=False`` record neither (the learned-geometry run never did: its
        manifests stay as they were). Every ``learned:RUN_DIR`` condition is pinned and checked against the plan's
        records (:func:`relaylens.experiments.learned.check_learned_conditions`)."""
        config = self.config
        url = redact_url(config.judge_url) if judge_url and config.judge_url else None
        run = vars(config) | dict.fromkeys(UNRECORDED) | {"judge_url": url}
        recorded = {"spec": self.spec.to_dict(), "run": run}
        if placement:
            recorded["placement"] = self.placement.to_dict() | {
                "device": self.placement.device and self.placement.device.split(":")[0]}
            recorded["decoding"] = decoding_path(self.model)
            upcast, why = self.upcast()
            if upcast:  # absent elsewhere: manifests written before it existed stay equal
                recorded["placement"]["products"] = why
        recorded |= (sections or {}) | {"rope": rope_summary(self.model)}
        manifest = build_manifest(self.spec.name, recorded, config.model, loading.model_fingerprint(self.model),
                                  self.data_path, self.shard,
                                  model_info=loading.model_files_fingerprint(self.model, self.tokenizer), plan=plan)
        spec = check_learned_conditions(self.spec, manifest, plan["record_ids"])  # pinned by content
        return replace(self, spec=spec, manifest=manifest)

    @contextmanager
    def session(self, previous: bool = False) -> Iterator[RunSession]:
        """Prepare and lock the run directory, build the judge, then create (or resume) the store; ``previous``:
        also read the manifest the directory held before (:func:`previous_manifest`)."""
        if self.manifest is None:
            raise RelaylensError("the run has no manifest yet. Fix: call opened.with_manifest(plan) before session()")
        prepare_run_dir(self.out)
        with run_lock(self.out, "run"):
            judge = make_judge(self.config, self.out, self.records)  # a bad judge setting fails before the manifest
            before = previous_manifest(self.out) if previous else None
            store = RunStore.create_or_open(self.out, self.manifest, force=self.config.force)
            products = "float32 kernels, bfloat16 results" if self.upcast()[0] else None
            store.machine = machine_stamp(str(next(self.model.parameters()).device), products)  # in every new unit
            yield RunSession(store, judge, before)


def open_run(spec: ExperimentSpec, config: RunConfig, model_and_tokenizer=None) -> OpenedRun:
    """Records, shard, directory, model, tokenizer and rotary factors of a run of ``spec`` under ``config``
    (``model_and_tokenizer``: an already loaded pair instead of ``config.model``)."""
    refuse_random(config.model, f"relaylens run {spec.name}")  # random weights: no accuracy, refused before loading
    auto = bool(config.shard) and config.shard.strip().lower() == "auto"
    launcher = detect_shard() if auto else None  # torchrun / accelerate / SLURM: the shard and the local rank
    placement = config.placement(local_rank=launcher.local_rank if launcher else None)
    data_path, records = run_records(spec, config)
    shard = (launcher.index, launcher.count) if launcher else parse_shard(config.shard) if config.shard else None
    if shard:
        chosen = set(shard_records([r.record_id for r in records], *shard))
        records = [r for r in records if r.record_id in chosen]
    out = Path(config.out or f"runs/{spec.name}")
    if launcher:  # one run directory, one shard directory per process
        out = shard_dir(out, *shard)
    config = replace(config, decoding=resolve_decoding(  # the manifest records the path, never "auto"
        config.decoding, placement.device, device_map=config.device_map, compile_backend=config.compile_backend,
        resumed=resumed_decoding(out)))
    model, tokenizer = model_and_tokenizer or loading.load_model(config.model, **placement.load_kwargs())
    if spec.prompt_mode == "auto":
        spec = spec.replace(prompt_mode="chat" if getattr(tokenizer, "chat_template", None) else "completion")
    return OpenedRun(spec, config, records, data_path, out, shard, placement, model, tokenizer,
                     RotaryFactors.from_model(model))


def analysis_plan(opened: OpenedRun) -> dict:
    """The plan of an analysis run: its record ids and how many units they make (``merge`` checks completeness)."""
    return {"record_ids": opened.record_ids, "units": len(opened.spec.units(opened.record_ids))}


def resumed_decoding(out: Path) -> str | None:
    """The decoding path of the run ``out`` already holds (a manifest without one decoded dynamically; None: a new
    directory)."""
    manifest = previous_manifest(out)
    if manifest is None:
        return None
    return manifest_section(manifest, "config", "run").get("decoding", ABSENT_MEANS["config.run.decoding"])


def previous_manifest(out: Path) -> dict | None:
    """The manifest a run directory already holds (None: a new directory, or one ``create_or_open`` will refuse)."""
    if not (out / "manifest.json").is_file():
        return None
    try:
        return RunStore.open(out).manifest
    except RelaylensError:
        return None
