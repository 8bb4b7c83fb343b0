"""Sweeps on Ray: one analysis split into N record shards, each a Ray task with its own CPUs/GPUs, merged at the end.

``relaylens sweep ANALYSIS --shards N [--gpus-per-shard G] [--ray-address ADDR] [run options]`` starts (or joins) a
Ray cluster, runs shard ``i`` as a task that calls the ordinary runner with ``--shard i/N`` into
``RUN_DIR/shards/i-of-N`` (:func:`relaylens.experiments.launch.shard_dir`), shows one progress view over all shards, and when
every shard has finished merges them into ``RUN_DIR`` (:func:`relaylens.results.shards.merge_run_dir`), then draws the
figures and writes the HTML report.

**The contract is the run directory.** ``RUN_DIR`` must be on storage that the driver and every worker see under
the same path (NFS, Lustre, a shared disk; any directory on a single machine). Workers commit each finished unit
there atomically, so a task that dies (a killed worker, a preempted node, out of memory) is retried by Ray
(``--max-retries``) and resumes from the units its earlier attempts committed. An error raised by relaylens itself
(bad input) is not retried: it would fail the same way. When a shard still fails, the others finish, nothing is
merged, and re-running the same command resumes every shard.

**A local instance stays on this machine.** Without ``--ray-address`` (and ``RAY_ADDRESS``) the sweep starts Ray
with its node address on the loopback interface, so the GCS, the raylet, the agents and the workers listen on
127.0.0.1 only (Ray's single-machine mode), and without the dashboard (``--ray-dashboard`` starts it, on 127.0.0.1);
a Ray that will not bind to loopback is shut down and refused. Joining a cluster fails within a bounded time when nothing answers: the address is probed first
(``CONNECT_PROBE_S``) and the connection must complete within ``SweepOptions.connect_timeout_s``.

**Code on the workers.** On a local Ray instance (no ``--ray-address``, no ``RAY_ADDRESS``) the workers import the
driver's relaylens (its directory is put on their ``PYTHONPATH``). On a cluster they import the relaylens installed
on the nodes; each shard's manifest records its versions and git commit, and the merge refuses shards that differ.

Ray is optional (``pip install 'relaylens[ray]'``); nothing else in relaylens imports it.

Example:
    $ relaylens sweep coordinate_ablation --shards 4 --gpus-per-shard 1 --out /shared/runs/ablation
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from relaylens.errors import RelaylensError
from relaylens.experiments.launch import shard_dir

__all__ = ["SweepOptions", "SweepError", "RAY_MISSING", "import_ray", "run_sweep", "run_shard", "attempts_path"]

RAY_MISSING = ("relaylens sweep runs its shards on Ray, which is not installed. Fix: pip install 'relaylens[ray]' "
               "(or pip install ray); everything else (run, --shard i/n or auto, merge) works without it")
ATTEMPTS = ".attempts.jsonl"
"""Suffix of ``RUN_DIR/shards/I-of-N.attempts.jsonl``: one line per attempt of a shard task (host, pid, start time),
beside the shard directory (which holds only what the store writes); the progress view reads it."""
CONNECT_PROBE_S = 10.0
"""Seconds a TCP connection to ``--ray-address`` may take before the sweep says nothing answers there."""
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for its single-machine mode ("0": the node address is the loopback address, and every server of the
node listens on it only); read by ``ray._private.ray_constants`` when Ray is imported, inherited by its processes."""


def attempts_path(run_dir: str | Path, index: int, count: int) -> Path:
    """Where the attempts of shard ``index`` of ``count`` are logged.

    >>> attempts_path("runs/x", 0, 2).as_posix()
    'runs/x/shards/0-of-2.attempts.jsonl'
    """
    path = shard_dir(run_dir, index, count)
    return path.with_name(path.name + ATTEMPTS)


class SweepError(RelaylensError):
    """A sweep that cannot start (no Ray, resources the cluster lacks) or whose shards failed."""


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
            _address_parts(self.ray_address)  # a malformed address: one line now, not a hang later


def import_ray():
    """The ``ray`` module, or a :class:`SweepError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise SweepError(RAY_MISSING) from None
    return ray


def run_shard(spec, config, index: int, count: int, run_dir: str) -> dict:
    """Body of one shard task (runs in a Ray worker): the ordinary runner on shard ``index`` of ``count``, writing
    into ``RUN_DIR/shards/index-of-count``; a retried attempt resumes from the units committed there."""
    from relaylens.experiments.runner import run_analysis

    out = shard_dir(run_dir, index, count)
    out.parent.mkdir(parents=True, exist_ok=True)
    attempt = {"host": socket.gethostname(), "pid": os.getpid(), "started_at": time.time()}
    with open(attempts_path(run_dir, index, count), "a", encoding="utf-8") as f:
        f.write(json.dumps(attempt) + "\n")
    run_analysis(spec, dataclasses.replace(config, shard=f"{index}/{count}", out=str(out)), progress=False)
    return {**attempt, "index": index, "units": len(list((out / "units").glob("[0-9a-f]*.json.gz")))}


def _absolute(config):
    """Paths a worker on another machine (or in another directory) must read the same way."""
    from relaylens.datasets import SAMPLE

    data = config.data if config.data == SAMPLE else str(Path(config.data).resolve())
    model = str(Path(config.model).resolve()) if Path(config.model).exists() else config.model
    return dataclasses.replace(config, data=data, model=model)


def _unit_totals(spec, config, count: int) -> list[int]:
    """Units per shard, as the runner will plan them (for the progress view only)."""
    from relaylens.datasets import load_records
    from relaylens.datasets import resolve_data
    from relaylens.results.shards import shard_records

    from relaylens.datasets import SAMPLE

    data = getattr(spec, "data", None) if config.data == SAMPLE else config.data  # as the runner resolves it
    records = load_records(resolve_data(data or config.data), format=config.data_format)
    limit = config.limit if config.limit is not None else spec.limit
    ids = [r.record_id for r in (records[:limit] if limit else records)]
    return [len(spec.units(shard_records(ids, i, count))) for i in range(count)]


def _address_parts(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT``; None for ``auto`` / ``local`` (Ray resolves them)."""
    text = str(address).strip()
    if text.lower() in ("auto", "local"):
        return None
    host, sep, port = text.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SweepError(f"--ray-address {address!r} is not a Ray address. Fix: HOST:PORT of the head's GCS (e.g. "
                         "10.0.0.5:6379), ray://HOST:10001 for Ray Client, or auto on a cluster node")
    return host, int(port)


def _probe(address: str) -> None:
    """Refuse within :data:`CONNECT_PROBE_S` an address where nothing accepts a TCP connection (Ray itself would
    retry forever)."""
    parts = _address_parts(address)
    if parts is None:
        return
    try:
        socket.create_connection(parts, timeout=CONNECT_PROBE_S).close()
    except OSError as err:
        why = err.strerror or str(err) or type(err).__name__
        raise SweepError(f"cannot reach Ray at {address}: nothing accepts connections there ({why}). Fix: start the "
                         "cluster (ray start --head) or correct --ray-address (HOST:PORT of the head's GCS, "
                         "ray://HOST:10001, or auto on a cluster node)") from None


@contextlib.contextmanager
def _loopback_only(ray):
    """Ray's single-machine mode for a local start: its node address is the loopback address, so every server of the
    node listens on 127.0.0.1 only (the environment variable for the processes it starts, the constant Ray read when
    it was imported for this one)."""
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    before_env, before = os.environ.get(LOOPBACK_ONLY), getattr(constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[LOOPBACK_ONLY] = "0"
    if before is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if before_env is None:
            os.environ.pop(LOOPBACK_ONLY, None)
        else:
            os.environ[LOOPBACK_ONLY] = before_env
        if before is not None:
            constants.ENABLE_RAY_CLUSTER = before


class _OtherThreadNotice(logging.Filter):
    """Drops Ray's notice that ``ray.init`` outside the main thread installs no SIGTERM handler (:func:`_join`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


def _join(ray, address: str | None, timeout_s: float) -> None:
    """``ray.init`` of an existing cluster, given up after ``timeout_s`` (Ray retries an address that does not answer
    as Ray forever): it runs on a daemon thread the sweep stops waiting for."""
    done, failure = threading.Event(), []

    def connect() -> None:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            failure.append(err)
        finally:
            done.set()

    notice = _OtherThreadNotice()
    logging.getLogger("ray._private.worker").addFilter(notice)
    try:
        threading.Thread(target=connect, name="relaylens-ray-join", daemon=True).start()
        answered = done.wait(timeout_s)
    finally:
        logging.getLogger("ray._private.worker").removeFilter(notice)
    where = address or os.environ.get("RAY_ADDRESS") or "auto"
    if not answered:
        raise SweepError(f"cannot reach Ray at {where}: no Ray cluster answered within {timeout_s:g} s. Fix: check "
                         "--ray-address (HOST:PORT of the head's GCS, ray://HOST:10001, or auto on a cluster node) and "
                         "that the cluster is up (ray status on the head)")
    if failure:
        ray.shutdown()
        raise SweepError(f"cannot reach Ray at {where}: {(str(failure[0]).strip().splitlines() or [''])[0]}. Fix: "
                         "check --ray-address (auto on a cluster node, or ray://HEAD:10001)") from None


def _start_local(ray, dashboard: bool = False) -> None:
    """A local instance in Ray's single-machine mode (loopback only; the dashboard only when asked for, on
    127.0.0.1), refused when Ray did not bind it to the loopback address."""
    import relaylens

    root = str(Path(relaylens.__file__).resolve().parent.parent)  # the workers import this process's relaylens
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}}
    for attempt in (1, 2, 3):  # a local start can time out on a loaded machine (the node's agents start slowly)
        try:
            with _loopback_only(ray):
                ray.init(runtime_env=runtime_env, include_dashboard=dashboard, dashboard_host="127.0.0.1",
                         log_to_driver=False, logging_level="WARNING")
            break
        except Exception as err:  # noqa: BLE001 - Ray raises plain Exception for a node that failed to start
            ray.shutdown()
            if attempt == 3:
                raise SweepError(f"cannot start a local Ray instance: {str(err).strip().splitlines()[0]}. Fix: retry "
                                 "on a less loaded machine, or join a cluster with --ray-address; Ray's logs are in "
                                 "/tmp/ray/session_latest/logs") from None
    node = ray.util.get_node_ip_address()
    if not ipaddress.ip_address(node.strip("[]")).is_loopback:
        ray.shutdown()
        raise SweepError(f"the local Ray instance bound to {node}, not to the loopback address, so its servers would "
                         f"listen on the network; relaylens refuses it (this Ray ignores {LOOPBACK_ONLY}=0). Fix: start "
                         "Ray yourself as you want it (ray start --head --node-ip-address ...) and pass --ray-address")


def _start_ray(ray, options: SweepOptions) -> bool:
    """Connect to ``options.ray_address`` or start a local instance; returns whether this call started Ray."""
    if ray.is_initialized():
        return False
    local = options.ray_address is None and not os.environ.get("RAY_ADDRESS")
    if local:
        _start_local(ray, options.dashboard)
    else:
        address = options.ray_address or os.environ.get("RAY_ADDRESS")
        _probe(address)
        _join(ray, options.ray_address, options.connect_timeout_s)
    if local:
        have = ray.cluster_resources()
        for kind, need in (("GPU", options.gpus_per_shard), ("CPU", options.cpus_per_shard)):
            if need > have.get(kind, 0):
                ray.shutdown()
                raise SweepError(f"each shard asks for {need:g} {kind}s but this machine's Ray instance has "
                                 f"{have.get(kind, 0):g}. Fix: lower --{kind.lower()}s-per-shard, or join a cluster "
                                 "with --ray-address")
    return True


def _attempts(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
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
    from relaylens.experiments.config import check_config
    from relaylens.results.shards import merge_run_dir

    if config.shard:
        raise SweepError(f"relaylens sweep assigns the shards itself; drop --shard {config.shard}")
    check_config(config)
    ray = import_ray()
    run_dir = Path(config.out or f"runs/{spec.name}").resolve()
    config = _absolute(dataclasses.replace(config, out=str(run_dir)))
    if options.gpus_per_shard > 0 and config.device is None and config.device_map is None:
        config = dataclasses.replace(config, device="auto")  # the task's GPUs (Ray sets CUDA_VISIBLE_DEVICES)
    totals = _unit_totals(spec, config, options.shards)
    started = _start_ray(ray, options)
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
        lines = "; ".join(f"shard{'s' if len(names) > 1 else ''} {', '.join(names)}: {msg}" for msg, names in by_cause.items())
        raise SweepError(f"{len(failures)} of {options.shards} shards failed ({lines}). Nothing was merged; finished "
                         f"units are kept in {run_dir / 'shards'}. Fix the cause, then re-run the same command: it "
                         "resumes every shard")
    merge_run_dir(run_dir)
    if report:
        import matplotlib

        matplotlib.use("Agg")
        from relaylens.reporting.figures import write_figures
        from relaylens.reporting.report import write_report

        write_figures(run_dir)
        write_report(run_dir)
    return run_dir


def _watch(ray, refs: dict, run_dir: Path, totals: list[int], options: SweepOptions, console) -> dict[int, str]:
    """Wait for every shard task, showing one progress view (units committed per shard, read from the run
    directory, and each shard's attempt); returns ``{shard: failure message}``."""
    from relaylens.progress import progress_view

    n = options.shards
    view = progress_view(console, remaining=False)
    failures: dict[int, str] = {}
    finished: set[int] = set()
    with view:
        overall = view.add_task(f"all {n} shards", total=sum(totals), stage="")
        bars = {i: view.add_task(f"shard {i}-of-{n}", total=totals[i], stage="queued") for i in range(n)}
        pending = list(refs)
        while True:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=options.poll_s) if pending else ([], [])
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
