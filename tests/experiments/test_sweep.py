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
    return cli(*args, env=env, timeout=timeout, check=check, prefix=[sys.executable, "-c", NO_RAY] if hide_ray else None)


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
                                 "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "2",
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
