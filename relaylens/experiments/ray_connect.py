"""Where a sweep's Ray comes from: a local instance that listens on loopback only, or a cluster joined within a
bounded time (:func:`start_ray`); and importing Ray at all (:func:`import_ray`).

* **Local** (no ``--ray-address``, no ``RAY_ADDRESS``): Ray's single-machine mode (:data:`LOOPBACK_ONLY`), so the
  node's address is 127.0.0.1 and the GCS, the raylet, the agents, the workers and the driver listen there only;
  no dashboard unless asked for (then on 127.0.0.1). A Ray that binds the instance elsewhere is shut down and refused.
* **A cluster**: a malformed address is refused at once (:func:`address_parts`); an address where nothing accepts a
  TCP connection is refused within :data:`CONNECT_PROBE_S`; a join that does not complete within the sweep's
  ``connect_timeout_s`` is given up (Ray itself retries an address that does not answer as Ray forever).

Ray is optional (``pip install 'relaylens[ray]'``); only this module and :mod:`~relaylens.experiments.sweep` import it.

Example:
    >>> address_parts("ray://head:10001"), address_parts("auto")
    (('head', 10001), None)
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import threading
from pathlib import Path

import relaylens
from relaylens.errors import RelaylensError

__all__ = ["RAY_MISSING", "CONNECT_PROBE_S", "LOOPBACK_ONLY", "SweepError", "import_ray", "address_parts", "start_ray"]

RAY_MISSING = ("relaylens sweep runs its shards on Ray, which is not installed. Fix: pip install 'relaylens[ray]' "
               "(or pip install ray); everything else (run, --shard i/n or auto, merge) works without it")
CONNECT_PROBE_S = 10.0
"""Seconds a TCP connection to ``--ray-address`` may take before the sweep says nothing answers there."""
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for its single-machine mode ("0": the node address is the loopback address, and every server of the
node listens on it only); read by ``ray._private.ray_constants`` when Ray is imported, inherited by its processes."""


class SweepError(RelaylensError):
    """A sweep that cannot start (no Ray, resources the cluster lacks) or whose shards failed."""


def import_ray():
    """The ``ray`` module, or a :class:`SweepError` saying how to install it."""
    try:
        import ray  # noqa: PLC0415 - optional/platform: imported inside try/except ImportError
    except ImportError:
        raise SweepError(RAY_MISSING) from None
    return ray


def address_parts(address: str) -> tuple[str, int] | None:
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
    parts = address_parts(address)
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
    node = str(ray.util.get_node_ip_address())
    try:
        loopback = ipaddress.ip_address(node.strip("[]")).is_loopback
    except ValueError:  # a host name
        loopback = node == "localhost"
    if not loopback:
        ray.shutdown()
        raise SweepError(f"the local Ray instance bound to {node}, not to the loopback address, so its servers would "
                         f"listen on the network; relaylens refuses it (this Ray ignores {LOOPBACK_ONLY}=0). Fix: "
                         "start Ray yourself as you want it (ray start --head --node-ip-address ...) and pass "
                         "--ray-address")


def start_ray(ray, options) -> bool:
    """Connect to ``options.ray_address`` (:class:`~relaylens.experiments.sweep.SweepOptions`) or start a local
    instance; returns whether this call started Ray."""
    if ray.is_initialized():
        return False
    if options.ray_address is not None or os.environ.get("RAY_ADDRESS"):
        _probe(options.ray_address or os.environ["RAY_ADDRESS"])
        _join(ray, options.ray_address, options.connect_timeout_s)
    else:
        _start_local(ray, options.dashboard)
        have = ray.cluster_resources()
        for kind, need in (("GPU", options.gpus_per_shard), ("CPU", options.cpus_per_shard)):
            if need > have.get(kind, 0):
                ray.shutdown()
                raise SweepError(f"each shard asks for {need:g} {kind}s but this machine's Ray instance has "
                                 f"{have.get(kind, 0):g}. Fix: lower --{kind.lower()}s-per-shard, or join a cluster "
                                 "with --ray-address")
    return True
