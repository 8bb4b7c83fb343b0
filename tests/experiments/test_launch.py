"""Launcher-aware sharding: shards read from torchrun / accelerate / SLURM variables, and clear errors otherwise.

The environments below are the variables each launcher sets (torchrun: RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT; SLURM arrays: SLURM_ARRAY_TASK_ID/COUNT/MIN/MAX/STEP next to the
job's own SLURM_PROCID=0, SLURM_NTASKS=1; srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID). Expected shards are
written out by hand from the launchers' documented numbering, not computed by the code under test.
"""

from __future__ import annotations

import pytest

from relaylens.experiments.launch import (
    LauncherError,
    ShardAssignment,
    detect_shard,
    resolve_shard,
    shard_dir,
)

TORCHRUN = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "4",
            "TORCHELASTIC_RUN_ID": "none"}
SLURM_JOB = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # torchrun --nproc-per-node 4 (single node), and accelerate launch (which sets the same variables)
        ({**TORCHRUN, "RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, ShardAssignment(0, 4, 0, "torchrun")),
        ({**TORCHRUN, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}, ShardAssignment(3, 4, 3, "torchrun")),
        # torchrun --nnodes 2 --nproc-per-node 4, second node's second process
        ({**TORCHRUN, "GROUP_RANK": "1", "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"},
         ShardAssignment(5, 8, 1, "torchrun")),
        # torchrun inside an sbatch job: torchrun's world wins over the job's single SLURM task
        ({**SLURM_JOB, **TORCHRUN, "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2"},
         ShardAssignment(2, 4, 2, "torchrun")),
        # sbatch --array=0-3: task 2
        ({**SLURM_JOB, "SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0",
          "SLURM_ARRAY_TASK_MAX": "3"}, ShardAssignment(2, 4, None, "slurm-array")),
        # sbatch --array=1-4: ids start at 1, task 1 is the first shard
        ({**SLURM_JOB, "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1",
          "SLURM_ARRAY_TASK_MAX": "4"}, ShardAssignment(0, 4, None, "slurm-array")),
        # sbatch --array=0-6:2 (ids 0, 2, 4, 6): id 4 is the third shard; count from MAX when COUNT is absent
        ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "6",
          "SLURM_ARRAY_TASK_STEP": "2"}, ShardAssignment(2, 4, None, "slurm-array")),
        # srun --ntasks 3: task 1 on its node's slot 1
        ({"SLURM_JOB_ID": "7", "SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_LOCALID": "1"},
         ShardAssignment(1, 3, 1, "slurm-tasks")),
        # older SLURM: SLURM_NPROCS instead of SLURM_NTASKS
        ({"SLURM_PROCID": "2", "SLURM_NPROCS": "3"}, ShardAssignment(2, 3, None, "slurm-tasks")),
        # a plain batch script (one task, no array) is the only shard
        ({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}, ShardAssignment(0, 1, None, "slurm-tasks")),
        # an array of 2 nodes, torchrun with 4 processes on each: array task 1, rank 3 -> shard 1*4+3 of 8
        ({**SLURM_JOB, **TORCHRUN, "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "RANK": "3",
          "WORLD_SIZE": "4", "LOCAL_RANK": "3"}, ShardAssignment(7, 8, 3, "slurm-array+torchrun")),
        # an array of 3 jobs with srun --ntasks 2 each: array task 2, task 0 -> shard 4 of 6
        ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
          "SLURM_LOCALID": "0"}, ShardAssignment(4, 6, 0, "slurm-array+slurm-tasks")),
    ],
    ids=["torchrun-r0", "torchrun-r3", "torchrun-2nodes", "torchrun-in-sbatch", "array-0-3", "array-1-4",
         "array-step2", "srun-ntasks", "srun-nprocs", "sbatch-single", "array+torchrun", "array+srun"],
)
def test_detect_shard_from_launcher_variables(env, expected):
    assert detect_shard(env) == expected
    assert resolve_shard("auto", env) == (expected.index, expected.count)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "found no launcher variables"),
        ({"PATH": "/usr/bin", "HOME": "/root"}, "found no launcher variables"),
        ({"RANK": "1"}, "RANK is set but WORLD_SIZE is not"),
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be >= 1"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1 must be >= 0"),
        ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2 is not below"),
        ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}, "LOCAL_RANK=3 exceeds RANK=1"),
        ({"LOCAL_RANK": "0"}, "LOCAL_RANK is set but RANK and WORLD_SIZE are not"),
        ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "4"}, "not one of the 4 ids"),
        ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "6",
          "SLURM_ARRAY_TASK_STEP": "2"}, "not one of the 4 ids"),
        ({"SLURM_ARRAY_TASK_ID": "1"}, "neither SLURM_ARRAY_TASK_COUNT nor SLURM_ARRAY_TASK_MAX"),
        ({"SLURM_ARRAY_TASK_COUNT": "4"}, "SLURM_ARRAY_TASK_ID is not"),
        ({"SLURM_PROCID": "3", "SLURM_NTASKS": "2"}, "SLURM_PROCID=3 is not below SLURM_NTASKS=2"),
        ({"SLURM_PROCID": "1"}, "SLURM_PROCID is set but SLURM_NTASKS is not"),
    ],
)
def test_missing_or_inconsistent_variables_give_one_clear_error(env, message):
    with pytest.raises(LauncherError, match="--shard auto") as err:
        detect_shard(env)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_no_launcher_error_names_the_variables_and_the_alternatives():
    with pytest.raises(LauncherError) as err:
        detect_shard({})
    text = str(err.value)
    for word in ("RANK", "WORLD_SIZE", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID", "--shard i/n", "relaylens sweep"):
        assert word in text


def test_empty_variables_count_as_unset():
    assert (detect_shard({"RANK": "1", "WORLD_SIZE": "2", "SLURM_ARRAY_TASK_ID": ""})
            == ShardAssignment(1, 2, None, "torchrun"))


def test_explicit_shards_still_parse_and_shard_dirs_are_named_by_index_and_count():
    assert resolve_shard("2/5", {}) == (2, 5)
    with pytest.raises(ValueError, match="--shard"):
        resolve_shard("5/5", {})
    assert shard_dir("/runs/x", 0, 2).as_posix() == "/runs/x/shards/0-of-2"


@pytest.mark.parametrize(
    ("env", "device"),
    [
        ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}, "cuda:3"),  # torchrun: LOCAL_RANK
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}, "cuda:1"),  # srun: SLURM_LOCALID
        ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4"}, "cuda:0"),  # an array task: its visible GPU
    ],
)
def test_device_auto_uses_the_launchers_local_rank(monkeypatch, env, device):
    """`--device auto` under a launcher: the process's GPU (CUDA faked as present with four devices)."""
    import torch

    from relaylens.experiments.runner import RunConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert RunConfig(device="auto").placement(local_rank=detect_shard(env).local_rank).device == device
