"""Scaling out through the real CLI on a tiny saved model: `relaylens run --shard auto` under torchrun's and a SLURM
array's variables, `relaylens sweep` on a local Ray instance (with a worker killed mid-run), and Ray being optional.

Every sharded result is compared with a single-process run of the same command: the merged tables, timing columns
dropped, serialised to parquet in their canonical (key-sorted) order, must be byte-identical. The single-process
run and the `--shard auto` runs execute with `ray` hidden from the import system, so they also show that nothing
but `sweep` needs Ray.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from support.runs import (  # tests/ is on sys.path under pytest (tests/conftest.py)
    CLI_ENV,
    cli,
    committed_units,
    comparable_tables,
    tiny_workspace,
)

from relaylens.experiments.sweep import attempts_path
from relaylens.results.store import load_tables

ANALYSIS = "coordinate_ablation"
RECORDS = 8  # split 4 + 4 by the record-id hash
RUN_OPTIONS = ["--max-new-tokens", "4", "--budget", "0.4", "--limit", str(RECORDS)]

# `python -c NO_RAY ARGS...` runs the relaylens CLI with every `ray` import failing as if Ray were not installed
NO_RAY = """
import runpy, sys
class _HideRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _HideRay())
sys.argv = ["relaylens", *sys.argv[1:]]
runpy.run_module("relaylens.cli", run_name="__main__")
"""


def _ray_available() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail("CI=true requires Ray (the dev extra installs it) to test relaylens sweep", pytrace=False)
        pytest.skip("ray is not installed (pip install 'relaylens[ray]')")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    from relaylens.datasets.synthetic import generate_records

    return tiny_workspace(tmp_path_factory.mktemp("scaling"), generate_records(n=RECORDS, seed=3, history_tokens=800))


def _args(workspace, command, out, *extra):
    _, model_dir, data = workspace
    return [command, ANALYSIS, "--model", str(model_dir), "--data", str(data), *RUN_OPTIONS, "--out", str(out), *extra]


def _cli(args, env=CLI_ENV, hide_ray=True, timeout=600, check=True):
    return cli(*args, env=env, timeout=timeout, check=check,
               prefix=[sys.executable, "-c", NO_RAY] if hide_ray else None)


def _canonical_bytes(run_dir) -> dict[str, bytes]:
    """Each table in its canonical order without timing columns, as parquet bytes."""
    out = {}
    for name, frame in comparable_tables(run_dir).items():
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        out[name] = buf.getvalue()
    return out


def _assert_equal_to_reference(reference, run_dir):
    expected, actual = reference[1], _canonical_bytes(run_dir)
    assert set(actual) == set(expected)
    for name in expected:
        assert actual[name] == expected[name], f"{name} differs from the single-process run"
    assert len(load_tables(run_dir)["answers"]) == RECORDS * 5  # eight records x five conditions


@pytest.fixture(scope="module")
def reference(workspace):
    out = workspace[0] / "single"
    _cli(_args(workspace, "run", out))
    return out, _canonical_bytes(out)


LAUNCHERS = {
    # torchrun --standalone --nproc-per-node 2 (accelerate launch sets the same variables)
    "torchrun": lambda rank: {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
                              "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
    # sbatch --array=1-2: task ids 1 and 2, each its own job with one task
    "slurm-array": lambda rank: {"SLURM_ARRAY_JOB_ID": "900", "SLURM_ARRAY_TASK_ID": str(rank + 1),
                                 "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "1",
                                 "SLURM_ARRAY_TASK_MAX": "2",
                                 "SLURM_JOB_ID": str(901 + rank), "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_shard_auto_processes_then_merge_equal_single_process(workspace, reference, launcher):
    out = workspace[0] / f"auto-{launcher}"
    prefix = [sys.executable, "-c", NO_RAY]
    processes = [subprocess.Popen(prefix + _args(workspace, "run", out, "--shard", "auto"), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env={**CLI_ENV, **LAUNCHERS[launcher](rank)})
                 for rank in range(2)]  # the same command line in both processes, started together
    for rank, process in enumerate(processes):
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-3000:]
        assert f"shard {rank}-of-2" in stderr and f"relaylens merge {out}" in stderr
    assert sorted(p.name for p in (out / "shards").iterdir()) == ["0-of-2", "1-of-2"]  # no attempt logs: not Ray
    assert [committed_units(out / "shards" / f"{i}-of-2") for i in range(2)] == [4, 4]
    assert not (out / "manifest.json").exists(), "rank 0 must not merge on its own"
    _cli(["merge", str(out)])
    _assert_equal_to_reference(reference, out)


def test_shard_auto_without_launcher_is_one_clear_line(workspace):
    env = {k: v for k, v in CLI_ENV.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    result = _cli(_args(workspace, "run", workspace[0] / "nolauncher", "--shard", "auto"), env=env, check=False)
    assert result.returncode == 2
    assert "--shard auto found no launcher variables" in result.stderr and "Traceback" not in result.stderr


def test_sweep_without_ray_says_how_to_install_it(workspace):
    result = _cli(_args(workspace, "sweep", workspace[0] / "noray", "--shards", "2"), check=False)
    assert result.returncode == 2
    assert "pip install 'relaylens[ray]'" in result.stderr and "Traceback" not in result.stderr


def test_sweep_on_local_ray_equals_single_process(workspace, reference):
    _ray_available()
    out = workspace[0] / "sweep"
    result = _cli(_args(workspace, "sweep", out, "--shards", "2", "--cpus-per-shard", "1"), hide_ray=False)
    assert "shard 0-of-2" in result.stderr and "shard 1-of-2" in result.stderr  # the progress view
    assert [committed_units(out / "shards" / f"{i}-of-2") for i in range(2)] == [4, 4]
    _assert_equal_to_reference(reference, out)
    assert (out / "report.html").exists() and any((out / "figures").iterdir())


def test_sweep_worker_killed_mid_run_is_retried_and_resumes(workspace, reference):
    """SIGKILL the Ray worker of one shard after it committed a unit: Ray retries the task, the new attempt resumes
    from the committed units, and the merged tables still equal the single-process run."""
    _ray_available()
    out = workspace[0] / "sweep-killed"
    process = subprocess.Popen([sys.executable, "-m", "relaylens.cli",
                                *_args(workspace, "sweep", out, "--shards", "2", "--max-retries", "2", "--no-report")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CLI_ENV)
    killed = None
    deadline = time.monotonic() + 400
    try:
        while killed is None and process.poll() is None and time.monotonic() < deadline:
            for i in range(2):
                shard = out / "shards" / f"{i}-of-2"
                units = committed_units(shard)
                log = attempts_path(out, i, 2)
                attempts = log.read_text().splitlines() if log.exists() else []
                if 1 <= units < 4 and attempts:
                    os.kill(json.loads(attempts[-1])["pid"], signal.SIGKILL)
                    killed = (i, {p.name: p.stat().st_mtime_ns for p in (shard / "units").glob("[0-9a-f]*.json.gz")})
                    break
            time.sleep(0.02)
        stdout, stderr = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    assert killed is not None, "no shard was caught mid-run"
    assert process.returncode == 0, stderr[-4000:]
    shard = out / "shards" / f"{killed[0]}-of-2"
    attempts = [json.loads(line) for line in attempts_path(out, killed[0], 2).read_text().splitlines()]
    assert len(attempts) == 2 and attempts[0]["pid"] != attempts[1]["pid"], "Ray did not retry the killed shard"
    assert committed_units(shard) == 4
    kept = {name: (shard / "units" / name).stat().st_mtime_ns for name in killed[1]}
    assert kept == killed[1], "the retried attempt recomputed units the killed one had committed"
    _assert_equal_to_reference(reference, out)


def test_sweep_shard_errors_are_named_per_shard_and_nothing_is_merged(workspace):
    """A relaylens error inside the tasks (a model path that does not exist) is not retried: the sweep ends with
    one line naming the failed shards and the cause, merges nothing, and keeps the shard directories."""
    _ray_available()
    out = workspace[0] / "sweep-bad-model"
    root, _, data = workspace
    result = _cli(["sweep", ANALYSIS, "--model", str(root / "no-such-model"), "--data", str(data), *RUN_OPTIONS,
                   "--out", str(out), "--shards", "2", "--no-report"], hide_ray=False, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    error = next(line for line in result.stderr.splitlines() if line.startswith("error:"))
    assert "2 of 2 shards failed (shards 0-of-2, 1-of-2: model path" in error and "does not exist" in error
    assert "re-run the same command" in error and "Traceback" not in result.stderr
    assert not (out / "manifest.json").exists()
    for i in range(2):  # one attempt each: an error of relaylens itself is not retried
        assert len(attempts_path(out, i, 2).read_text().splitlines()) == 1


# ------------------------------------------------------ issue 28 items 6 and 18: where Ray listens, reaching it

# Starts the sweep's local Ray instance, runs one task (so a worker exists), then lists every listening socket (TCP) and
# bound UDP socket of this process and its descendants, read from /proc: {"sockets": [[pid, command, address]], ...}.
LOCAL_SOCKETS = r"""
import json, os, socket, struct
from relaylens.experiments.ray_connect import import_ray, start_ray
from relaylens.experiments.sweep import SweepOptions

def descendants(root):
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        parents[int(pid)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid); grew = True
    return tree

def listening():
    found = {}
    for name, state in (("tcp", "0A"), ("tcp6", "0A"), ("udp", "07"), ("udp6", "07")):
        for line in open(f"/proc/net/{name}").read().splitlines()[1:]:
            fields = line.split()
            if fields[3] != state:
                continue
            hexip, port = fields[1].split(":")
            raw = bytes.fromhex(hexip)
            if len(raw) == 4:
                ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:
                ip = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            found[fields[9]] = f"{ip}:{int(port, 16)}"
    return found

ray = import_ray()
start_ray(ray, SweepOptions(shards=1))
try:
    assert ray.get(ray.remote(lambda: 1).remote()) == 1
    bound, out = listening(), []
    for pid in sorted(descendants(os.getpid())):
        try:
            command = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:160]
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        out += [[pid, command, bound[l[8:-1]]] for l in links if l.startswith("socket:[") and l[8:-1] in bound]
    print(json.dumps({"sockets": out, "node": ray.util.get_node_ip_address()}))
finally:
    ray.shutdown()
"""


def _is_loopback(address: str) -> bool:
    import ipaddress

    host = address.rsplit(":", 1)[0]
    ip = ipaddress.ip_address(host)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def test_local_sweep_ray_listens_on_loopback_only_without_a_dashboard():
    """A local sweep's Ray (GCS, raylet, agents, workers, the driver's own server) listens on 127.0.0.1 only: it used
    to bind the GCS and every gRPC server to all interfaces, reachable from the network."""
    _ray_available()
    result = subprocess.run([sys.executable, "-c", LOCAL_SOCKETS], capture_output=True, text=True, timeout=500,
                            env=CLI_ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    sockets = report["sockets"]
    assert any("gcs_server" in command for _, command, _ in sockets), sockets  # the servers were found
    exposed = [s for s in sockets if not _is_loopback(s[2])]
    assert not exposed, f"sockets of the local Ray instance listen beyond loopback: {exposed}"
    assert report["node"] == "127.0.0.1"
    assert not any("dashboard/dashboard.py" in command for _, command, _ in sockets), "a dashboard was started"


def test_sweep_with_nothing_at_the_ray_address_fails_within_seconds(workspace):
    """`--ray-address 127.0.0.1:1` (nothing listening) hung for over ten minutes; now one line, in seconds."""
    _ray_available()
    started = time.monotonic()
    result = _cli(_args(workspace, "sweep", workspace[0] / "unreachable", "--shards", "2", "--ray-address",
                        "127.0.0.1:1", "--no-report"), hide_ray=False, check=False, timeout=240)
    assert result.returncode == 2, result.stderr[-3000:]
    error = next(line for line in result.stderr.splitlines() if line.startswith("error:"))
    assert "cannot reach Ray at 127.0.0.1:1" in error and "Fix" in error and "Traceback" not in result.stderr
    assert time.monotonic() - started < 200  # importing Ray on a loaded machine takes most of it


NOT_RAY = r"""
import json, socket, sys, time
from relaylens.experiments.ray_connect import import_ray, start_ray
from relaylens.experiments.sweep import SweepError, SweepOptions

ray = import_ray()
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()  # accepts connections but never answers as Ray (and Ray itself dials the node's address, not 127.0.0.1)
started = time.monotonic()
try:
    start_ray(ray, SweepOptions(shards=1, ray_address=f"127.0.0.1:{server.getsockname()[1]}", connect_timeout_s=5))
    print(json.dumps({"connected": True}))
except SweepError as err:
    print(json.dumps({"error": str(err), "seconds": time.monotonic() - started}))
"""


def test_a_ray_address_where_no_ray_answers_gives_up_after_the_connect_timeout():
    _ray_available()
    result = subprocess.run([sys.executable, "-c", NOT_RAY], capture_output=True, text=True, timeout=300, env=CLI_ENV)
    assert result.returncode == 0, result.stderr[-3000:]  # and the process exits: the abandoned join does not hang it
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert "no Ray cluster answered within 5 s" in outcome["error"] and "Fix" in outcome["error"]
    assert outcome["seconds"] < 30


@pytest.mark.parametrize("address", ["127.0.0.1", "head:port", "ray://", "10.0.0.1:70000"])
def test_a_malformed_ray_address_is_refused_before_ray_starts(address):
    from relaylens.experiments.sweep import SweepError, SweepOptions

    with pytest.raises(SweepError, match=rf"--ray-address '{address}' is not a Ray address.*Fix"):
        SweepOptions(shards=1, ray_address=address)


class _FakeRay:
    """Records how the sweep calls ``ray.init`` and answers with ``node`` as the node's address."""

    def __init__(self, node: str):
        import types

        self.calls, self.shutdowns, self.node = [], 0, node
        self.util = types.SimpleNamespace(get_node_ip_address=lambda: self.node)

    def is_initialized(self):
        return False

    def init(self, **kwargs):
        from relaylens.experiments.ray_connect import LOOPBACK_ONLY

        self.calls.append({**kwargs, "loopback_env": os.environ.get(LOOPBACK_ONLY)})

    def shutdown(self):
        self.shutdowns += 1

    def cluster_resources(self):
        return {"CPU": 2.0}


@pytest.mark.parametrize("dashboard", [False, True])
def test_local_ray_starts_in_single_machine_mode_with_the_dashboard_only_when_asked(dashboard, monkeypatch):
    from relaylens.experiments.ray_connect import LOOPBACK_ONLY, start_ray
    from relaylens.experiments.sweep import SweepOptions

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(LOOPBACK_ONLY, raising=False)
    ray = _FakeRay("127.0.0.1")
    assert start_ray(ray, SweepOptions(shards=1, dashboard=dashboard)) is True
    (call,) = ray.calls
    assert call["loopback_env"] == "0" and call["include_dashboard"] is dashboard
    assert call["dashboard_host"] == "127.0.0.1"
    assert os.environ.get(LOOPBACK_ONLY) is None  # restored once Ray has started


def test_a_local_ray_bound_beyond_loopback_is_shut_down_and_refused(monkeypatch):
    from relaylens.experiments.ray_connect import start_ray
    from relaylens.experiments.sweep import SweepError, SweepOptions

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray = _FakeRay("192.0.2.2")
    with pytest.raises(SweepError, match=r"bound to 192\.0\.2\.2, not to the loopback address.*Fix"):
        start_ray(ray, SweepOptions(shards=1))
    assert ray.shutdowns == 1
