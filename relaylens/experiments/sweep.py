"""Sweeps on Ray: one analysis split into N record shards, each a Ray task with its own CPUs/GPUs, merged at the end.

``relaylens sweep ANALYSIS --shards N [--gpus-per-shard G] [--ray-address ADDR] [run options]`` starts (or joins) a
Ray cluster, runs shard ``i`` as a task that calls the ordinary runner with ``--shard i/N`` into
``RUN_DIR/shards/i-of-N`` (:func:`relaylens.experiments.launch.shard_dir`), shows one progress view over all shards, and
when every shard has finished merges them into ``RUN_DIR`` (:func:`relaylens.results.shards.merge_run_dir`), then draws
the figures and writes the HTML report.

**The contract is the run directory.** ``RUN_DIR`` must be on storage that the driver and every worker see under
the same path (NFS, Lustre, a shared disk; any directory on a single machine). Workers commit each finished unit
there atomically, so a task that dies (a killed worker, a preempted node, out of memory) is retried by Ray
(``--max-retries``) and resumes from the units its earlier attempts committed. An error raised by relaylens itself
(bad input) is not retried: it would fail the same way. When a shard still fails, the others finish, nothing is
merged, and re-running the same command resumes every shard.

**A local instance stays on this machine.** Without ``--ray-address`` (and ``RAY_ADDRESS``) Ray starts in its
single-machine mode: every server listens on 127.0.0.1 only, with no dashboard unless ``--ray-dashboard``. Joining a
cluster fails within a bounded time when nothing answers there (:mod:`relaylens.experiments.ray_connect`).

**Code on the workers.** On a local Ray instance (no ``--ray-address``, no ``RAY_ADDRESS``) the workers import the
driver's relaylens (its directory is put on their ``PYTHONPATH``). On a cluster they import the relaylens installed
on the nodes; each shard's manifest records its versions and git commit, and the merge refuses shards that differ.

Ray is optional (``pip install 'relaylens[ray]'``); nothing outside this module and ray_connect imports it.

Example:
    $ relaylens sweep coordinate_ablation --shards 4 --gpus-per-shard 1 --out /shared/runs/ablation
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from relaylens.datasets import SAMPLE
from relaylens.errors import RelaylensError
from relaylens.experiments.config import check_config, run_records
from relaylens.experiments.launch import shard_dir
from relaylens.experiments.ray_connect import RAY_MISSING, SweepError, address_parts, import_ray, start_ray
from relaylens.progress import progress_view
from relaylens.results.atomic import append_text, read_text, safe_subdir
from relaylens.results.shards import SHARDS, merge_run_dir, shard_records

__all__ = ["SweepOptions", "SweepError", "RAY_MISSING", "import_ray", "run_sweep", "run_shard", "attempts_path"]

ATTEMPTS = ".attempts.jsonl"
"""Suffix of ``RUN_DIR/shards/I-of-N.attempts.jsonl``: one line per attempt of a shard task (host, pid, start time),
beside the shard directory (which holds only what the store writes); the progress view reads it."""


def attempts_path(run_dir: str | Path, index: int, count: int) -> Path:
    """Where the attempts of shard ``index`` of ``count`` are logged.

    >>> attempts_path("runs/x", 0, 2).as_posix()
    'runs/x/shards/0-of-2.attempts.jsonl'
    """
    path = shard_dir(run_dir, index, count)
    return path.with_name(path.name + ATTEMPTS)


@dataclass(frozen=True)
class SweepOptions:
    """How the shards are placed on Ray.

    Attributes:
        shards: number of record shards (Ray tasks).
        gpus_per_shard: GPUs each task reserves (Ray sets ``CUDA_VISIBLE_DEVICES``; ``--device auto`` uses them).
        cpus_per_shard: CPUs each task reserves (Ray sets the task's thread count to it).
        ray_address: an existing cluster (``auto``, ``HOST:PORT``, ``ray://head:10001``); ``None`` starts a local
            instance (loopback only, no dashboard).
        max_retries: how often Ray restarts a shard whose worker died; each attempt resumes from committed units.
        poll_s: seconds between progress updates.
        connect_timeout_s: seconds joining ``ray_address`` may take before the sweep gives up.
        dashboard: start Ray's dashboard with a local instance (on 127.0.0.1; off by default).
    """

    shards: int
    gpus_per_shard: float = 0
    cpus_per_shard: float = 1
    ray_address: str | None = None
    max_retries: int = 3
    poll_s: float = 0.5
    connect_timeout_s: float = 120.0
    dashboard: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.shards, bool) or not isinstance(self.shards, int) or self.shards < 1:
            raise SweepError(f"--shards must be a positive number of shards; got {self.shards!r}")
        if self.gpus_per_shard < 0 or self.cpus_per_shard < 0:
            raise SweepError(f"--gpus-per-shard and --cpus-per-shard must be >= 0; got {self.gpus_per_shard}, "
                             f"{self.cpus_per_shard}")
        if self.max_retries < 0:
            raise SweepError(f"--max-retries must be >= 0; got {self.max_retries}")
        if not self.connect_timeout_s > 0:
            raise SweepError(f"connect_timeout_s must be a positive number of seconds; got {self.connect_timeout_s!r}")
        if self.ray_address is not None:
            address_parts(self.ray_address)  # a malformed address: one line now, not a hang later


def run_shard(spec, config, index: int, count: int, run_dir: str) -> dict:
    """Body of one shard task (runs in a Ray worker): the ordinary runner on shard ``index`` of ``count``, writing
    into ``RUN_DIR/shards/index-of-count``; a retried attempt resumes from the units committed there."""
    from relaylens.experiments.runner import run_analysis  # noqa: PLC0415 - import cost: torch and transformers load on first use

    out = shard_dir(run_dir, index, count)
    safe_subdir(run_dir, SHARDS)  # a linked shards/ (or any link below RUN_DIR) is refused, never written through
    attempt = {"host": socket.gethostname(), "pid": os.getpid(), "started_at": time.time()}
    append_text(attempts_path(run_dir, index, count), json.dumps(attempt) + "\n")  # never through a link
    run_analysis(spec, dataclasses.replace(config, shard=f"{index}/{count}", out=str(out)), progress=False)
    return {**attempt, "index": index, "units": len(list((out / "units").glob("[0-9a-f]*.json.gz")))}


def _absolute(config):
    """Paths a worker on another machine (or in another directory) must read the same way."""
    data = config.data if config.data == SAMPLE else str(Path(config.data).resolve())
    model = str(Path(config.model).resolve()) if Path(config.model).exists() else config.model
    return dataclasses.replace(config, data=data, model=model)


def _unit_totals(spec, config, count: int) -> list[int]:
    """Units per shard, as the runner will plan them (for the progress view only)."""
    ids = [r.record_id for r in run_records(spec, config)[1]]  # the runner's records, in its order
    return [len(spec.units(shard_records(ids, i, count))) for i in range(count)]


def _attempts(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in (read_text(path) or "").splitlines() if line.strip()]
    except (OSError, ValueError):  # UnsafePathError is a ValueError: a planted link is not read (run_shard refuses it)
        return []


def _failure(err: BaseException, max_retries: int) -> str:
    """One line for a failed shard task: relaylens's own message, the original exception, or a dead worker."""
    cause = getattr(err, "cause", None)  # ray.exceptions.RayTaskError carries the exception raised in the task
    if isinstance(cause, RelaylensError):
        return str(cause)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0]}"
    name = type(err).__name__
    if any(word in name for word in ("Crashed", "Died", "Lost", "Unavailable")):
        return (f"its worker died (killed, out of memory, or the node was lost) and the {max_retries} retries were "
                "used up")
    return f"{name}: {(str(err).strip().splitlines() or [''])[0]}"


def run_sweep(spec, config, options: SweepOptions, console=None, report: bool = True) -> Path:
    """Run ``spec`` under ``config`` as ``options.shards`` Ray tasks, merge, then draw figures and the report.

    Returns the run directory (``config.out``, default ``runs/ANALYSIS``). Raises :class:`SweepError` naming every
    failed shard; finished units stay in the shard directories, so re-running the same call resumes.
    """
    if config.shard:
        raise SweepError(f"relaylens sweep assigns the shards itself; drop --shard {config.shard}")
    check_config(config)
    ray = import_ray()
    run_dir = Path(config.out or f"runs/{spec.name}").resolve()
    config = _absolute(dataclasses.replace(config, out=str(run_dir)))
    if options.gpus_per_shard > 0 and config.device is None and config.device_map is None:
        config = dataclasses.replace(config, device="auto")  # the task's GPUs (Ray sets CUDA_VISIBLE_DEVICES)
    totals = _unit_totals(spec, config, options.shards)
    started = start_ray(ray, options)
    try:
        task = ray.remote(run_shard).options(num_cpus=options.cpus_per_shard, num_gpus=options.gpus_per_shard,
                                             max_retries=options.max_retries, retry_exceptions=False)
        refs = {task.remote(spec, config, i, options.shards, str(run_dir)): i for i in range(options.shards)}
        failures = _watch(ray, refs, run_dir, totals, options, console)
    finally:
        if started:
            ray.shutdown()
    if failures:
        by_cause: dict[str, list[str]] = {}
        for i, msg in sorted(failures.items()):
            by_cause.setdefault(msg.rstrip("."), []).append(f"{i}-of-{options.shards}")
        lines = "; ".join(f"shard{'s' if len(names) > 1 else ''} {', '.join(names)}: {msg}" for msg,
                          names in by_cause.items())
        raise SweepError(f"{len(failures)} of {options.shards} shards failed ({lines}). Nothing was merged; finished "
                         f"units are kept in {run_dir / 'shards'}. Fix the cause, then re-run the same command: it "
                         "resumes every shard")
    merge_run_dir(run_dir)
    if report:
        import matplotlib  # noqa: PLC0415 - import cost: matplotlib loads on first use

        matplotlib.use("Agg")
        from relaylens.reporting.figures import write_figures  # noqa: PLC0415 - import cost: matplotlib and seaborn load on first use
        from relaylens.reporting.report import write_report  # noqa: PLC0415 - import cost: matplotlib and seaborn load on first use

        write_figures(run_dir)
        write_report(run_dir)
    return run_dir


def _watch(ray, refs: dict, run_dir: Path, totals: list[int], options: SweepOptions, console) -> dict[int, str]:
    """Wait for every shard task, showing one progress view (units committed per shard, read from the run
    directory, and each shard's attempt); returns ``{shard: failure message}``."""
    n = options.shards
    view = progress_view(console, remaining=False)
    failures: dict[int, str] = {}
    finished: set[int] = set()
    with view:
        overall = view.add_task(f"all {n} shards", total=sum(totals), stage="")
        bars = {i: view.add_task(f"shard {i}-of-{n}", total=totals[i], stage="queued") for i in range(n)}
        pending = list(refs)
        while True:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=options.poll_s) if pending else ([],
                                                                                                                  [])
            for ref in ready:
                i = refs[ref]
                try:
                    ray.get(ref)
                    finished.add(i)
                except Exception as err:  # noqa: BLE001 - every task failure is reported by shard
                    failures[i] = _failure(err, options.max_retries)
            done_units = 0
            for i in range(n):
                path = shard_dir(run_dir, i, n)
                units = len(list((path / "units").glob("[0-9a-f]*.json.gz"))) if path.exists() else 0
                done_units += units
                tries = _attempts(attempts_path(run_dir, i, n))
                stage = ("failed" if i in failures else "finished" if i in finished else
                         "queued" if not tries else f"attempt {len(tries)} on {tries[-1]['host']}")
                view.update(bars[i], completed=units, stage=stage)
            view.update(overall, completed=done_units, stage=f"{len(finished)} finished, {len(failures)} failed")
            if not pending:
                return failures
