"""Launcher-aware sharding: which shard this process runs, read from the variables its launcher set.

``relaylens run ANALYSIS --shard auto`` runs the same command line under every launcher; this module turns the
launcher's environment into a shard ``(index, count)`` and, for ``--device auto``, the process's local rank:

=====================================  ===========================================  ==========================
launcher                               variables read                               shard
=====================================  ===========================================  ==========================
torchrun, ``accelerate launch``        ``RANK``, ``WORLD_SIZE`` (``LOCAL_RANK``)    ``RANK`` of ``WORLD_SIZE``
SLURM job array (``sbatch --array``)   ``SLURM_ARRAY_TASK_ID``,                     position of the task id in
                                       ``SLURM_ARRAY_TASK_COUNT`` (``_MIN``,        the array
                                       ``_STEP``, ``_MAX``)
SLURM tasks (``srun --ntasks N``)      ``SLURM_PROCID``, ``SLURM_NTASKS``           ``PROCID`` of ``NTASKS``
                                       (``SLURM_LOCALID``)
=====================================  ===========================================  ==========================

Levels nest: an array task that itself starts several processes (torchrun, or ``srun`` tasks) runs shard
``array_index * inner_count + inner_rank`` of ``array_count * inner_count``. torchrun's variables take precedence
over ``SLURM_PROCID``/``SLURM_NTASKS`` (``srun torchrun`` sets both; torchrun's world is the one that spans the
processes). A single batch task (``SLURM_NTASKS=1``, no array) is shard 0 of 1.

Example:
    >>> detect_shard({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    ShardAssignment(index=1, count=4, local_rank=1, launcher='torchrun')
    >>> detect_shard({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "5"}).index
    2
    >>> resolve_shard("auto", {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})
    (0, 2)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from relaylens.errors import RelaylensError
from relaylens.results.shards import parse_shard

__all__ = ["ShardAssignment", "LauncherError", "detect_shard", "resolve_shard", "shard_dir", "LAUNCHER_VARIABLES"]

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT",
                      "SLURM_PROCID", "SLURM_NTASKS")
"""The variables ``--shard auto`` looks for (named in its error when none is set)."""

from relaylens.results.shards import SHARDS  # noqa: E402 - the folder of a run's shard directories


class LauncherError(RelaylensError):
    """``--shard auto`` found no launcher variables, or variables that contradict each other."""


@dataclass(frozen=True)
class ShardAssignment:
    """The shard of this process: ``index`` of ``count`` (``0 <= index < count``).

    Attributes:
        index: shard number, ``0..count-1``.
        count: number of shards (processes) of the sweep.
        local_rank: the process's rank on its node (torchrun ``LOCAL_RANK``, SLURM ``SLURM_LOCALID``), which picks
            its GPU under ``--device auto``; ``None`` when the launcher gives none (an array task owns its node's
            visible devices).
        launcher: ``torchrun``, ``slurm-array``, ``slurm-tasks`` or a ``+``-joined nesting of them.
    """

    index: int
    count: int
    local_rank: int | None
    launcher: str


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    raw = env[name].strip()
    try:
        value = int(raw)
    except ValueError:
        raise LauncherError(f"--shard auto: {name}={raw!r} is not an integer. Fix: check the launcher's environment "
                            "(or pass --shard i/n explicitly)") from None
    if value < minimum:
        raise LauncherError(f"--shard auto: {name}={value} must be >= {minimum}")
    return value


def _pair(env: Mapping[str, str], rank: str, size: str) -> tuple[int, int] | None:
    """``(rank, size)`` from two variables that must come together, with ``0 <= rank < size``."""
    have = [v for v in (rank, size) if v in env]
    if not have:
        return None
    if len(have) == 1:
        missing = size if have == [rank] else rank
        raise LauncherError(f"--shard auto: {have[0]} is set but {missing} is not; a launcher sets both. Fix: start "
                            "the command with the launcher, or pass --shard i/n explicitly")
    r, n = _int(env, rank), _int(env, size, minimum=1)
    if r >= n:
        raise LauncherError(f"--shard auto: {rank}={r} is not below {size}={n} (ranks are 0..{n - 1}); the launcher "
                            "variables are inconsistent")
    return r, n


def _slurm_array(env: Mapping[str, str]) -> tuple[int, int] | None:
    """``(position, count)`` of this task in its job array; task ids may start anywhere and step (``--array=1-9:2``)."""
    if "SLURM_ARRAY_TASK_ID" not in env:
        if "SLURM_ARRAY_TASK_COUNT" in env:
            raise LauncherError("--shard auto: SLURM_ARRAY_TASK_COUNT is set but SLURM_ARRAY_TASK_ID is not; the "
                                "launcher variables are inconsistent")
        return None
    task = _int(env, "SLURM_ARRAY_TASK_ID")
    low = _int(env, "SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0
    step = _int(env, "SLURM_ARRAY_TASK_STEP", minimum=1) if "SLURM_ARRAY_TASK_STEP" in env else 1
    if "SLURM_ARRAY_TASK_COUNT" in env:
        count = _int(env, "SLURM_ARRAY_TASK_COUNT", minimum=1)
    elif "SLURM_ARRAY_TASK_MAX" in env:
        count = (_int(env, "SLURM_ARRAY_TASK_MAX") - low) // step + 1
    else:
        raise LauncherError("--shard auto: SLURM_ARRAY_TASK_ID is set but neither SLURM_ARRAY_TASK_COUNT nor "
                            "SLURM_ARRAY_TASK_MAX is; cannot tell how many shards the array has. Fix: pass "
                            "--shard $SLURM_ARRAY_TASK_ID/N explicitly")
    offset, rest = divmod(task - low, step)
    if task < low or rest or offset >= count:
        raise LauncherError(f"--shard auto: SLURM_ARRAY_TASK_ID={task} is not one of the {count} ids of the array "
                            f"(from {low}, step {step}); relaylens needs an evenly spaced array such as "
                            f"--array=0-{count - 1}. Fix: use a contiguous --array range, or pass --shard i/n "
                            "explicitly")
    return offset, count


def _slurm_tasks(env: Mapping[str, str]) -> tuple[int, int] | None:
    """``(SLURM_PROCID, SLURM_NTASKS)`` of an ``srun`` step (``SLURM_NPROCS`` is the older name of the count); a
    batch script's lone task (``SLURM_PROCID=0`` without a count) is task 0 of 1."""
    env = dict(env)
    if "SLURM_NTASKS" not in env and "SLURM_NPROCS" in env:
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"]
    if "SLURM_PROCID" in env and "SLURM_NTASKS" not in env and env["SLURM_PROCID"].strip() == "0":
        return 0, 1
    return _pair(env, "SLURM_PROCID", "SLURM_NTASKS")


def detect_shard(environ: Mapping[str, str] | None = None) -> ShardAssignment:
    """The shard of this process from its launcher's variables (default ``os.environ``); see the module docstring.

    Raises :class:`LauncherError` when no launcher variable is set or they contradict each other.

    >>> detect_shard({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "RANK": "3", "WORLD_SIZE": "4"})
    ShardAssignment(index=7, count=8, local_rank=None, launcher='slurm-array+torchrun')
    """
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if v is not None and v.strip() != ""}
    array = _slurm_array(env)
    torch_pair = _pair(env, "RANK", "WORLD_SIZE")
    tasks = None if torch_pair else _slurm_tasks(env)
    if array is not None and tasks is not None and tasks[1] == 1:
        tasks = None  # the array task's own single task: no level of its own
    local_rank = None
    if torch_pair:
        inner, inner_name = torch_pair, "torchrun"
        if "LOCAL_RANK" in env:
            local_rank = _int(env, "LOCAL_RANK")
            if "LOCAL_WORLD_SIZE" in env and local_rank >= _int(env, "LOCAL_WORLD_SIZE", minimum=1):
                raise LauncherError(f"--shard auto: LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE="
                                    f"{env['LOCAL_WORLD_SIZE']}; the launcher variables are inconsistent")
            if local_rank > torch_pair[0]:
                raise LauncherError(f"--shard auto: LOCAL_RANK={local_rank} exceeds RANK={torch_pair[0]}; the launcher "
                                    "variables are inconsistent")
    elif tasks:
        inner, inner_name = tasks, "slurm-tasks"
        if "SLURM_LOCALID" in env:
            local_rank = _int(env, "SLURM_LOCALID")
    else:
        if "LOCAL_RANK" in env:
            raise LauncherError("--shard auto: LOCAL_RANK is set but RANK and WORLD_SIZE are not; torchrun and "
                                "accelerate set all three. Fix: start the command with the launcher, or pass --shard "
                                "i/n")
        inner, inner_name = None, ""
    if array is None and inner is None:
        raise LauncherError("--shard auto found no launcher variables (looked for " + ", ".join(LAUNCHER_VARIABLES)
                            + "). Fix: start the command under torchrun, accelerate launch, a SLURM array or srun, "
                            "pass --shard i/n explicitly, or use `relaylens sweep` to start the shards on Ray")
    if array is None:
        return ShardAssignment(inner[0], inner[1], local_rank, inner_name)
    if inner is None:
        return ShardAssignment(array[0], array[1], None, "slurm-array")
    return ShardAssignment(array[0] * inner[1] + inner[0], array[1] * inner[1], local_rank, f"slurm-array+{inner_name}")


def resolve_shard(text: str, environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``"auto"`` -> the launcher's shard (:func:`detect_shard`); ``"i/n"`` -> ``(i, n)``.

    >>> resolve_shard("1/3")
    (1, 3)
    """
    if text.strip().lower() == "auto":
        assignment = detect_shard(environ)
        return assignment.index, assignment.count
    return parse_shard(text)


def shard_dir(run_dir: str | Path, index: int, count: int) -> Path:
    """The directory of shard ``index`` of ``count`` inside one run directory: ``RUN_DIR/shards/I-of-N``.

    ``relaylens run --shard auto`` and ``relaylens sweep`` write there; ``relaylens merge RUN_DIR`` reads them.

    >>> shard_dir("runs/ablation", 1, 4).as_posix()
    'runs/ablation/shards/1-of-4'
    """
    return Path(run_dir) / SHARDS / f"{index}-of-{count}"
