"""Round 5 (issue 52, items 1 and 2): nothing a command writes, appends or deletes in a run directory goes through a
symbolic link -- the judge's verdict caches (``relaylens judge`` and ``relaylens run --judge-*``), the sweep's
``shards/I-of-N.attempts.jsonl``, and the output folders ``figures/``, ``units/``, ``views/``, ``shards/`` (any link on
the path below the run directory), ``learned_geometry --force`` deleting units included.

Each test plants a link (or a hard link, a file where a folder belongs) and checks that the command refuses it with one
line naming the path and that the link's target is untouched -- byte for byte, and no file added."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from relaylens.fileio import UnsafePathError, append_text, check_below, read_text, safe_subdir
from relaylens.results.store import RunStore, UnitKey
from tests.support.runs import fill, manifest

RECORD = {"record_id": "q1", "question": "What is my dog called?", "answers": ["Biscuit"]}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A folder outside the run directory holding a file a link could make relaylens overwrite or append to."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "precious.txt").write_text("keep me\n")
    return target


@pytest.fixture
def run(tmp_path) -> Path:
    run_dir = tmp_path / "run"
    fill(RunStore.create_or_open(run_dir, manifest()), ["r1", "r2"])
    return run_dir


# --------------------------------------------------------------------------------------------- item 1: appends
def test_append_and_read_refuse_links_fifos_and_hard_links(tmp_path, elsewhere):
    precious = elsewhere / "precious.txt"
    (tmp_path / "link.jsonl").symlink_to(precious)
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    os.link(precious, tmp_path / "hard.jsonl")
    os.mkfifo(tmp_path / "fifo.jsonl")
    (tmp_path / "folder.jsonl").mkdir()
    for name in ("link.jsonl", "dangling.jsonl", "hard.jsonl", "fifo.jsonl", "folder.jsonl"):
        with pytest.raises(UnsafePathError, match=f"refuses to append to .*{name}.*Fix:"):
            append_text(tmp_path / name, "x\n")
        if name != "dangling.jsonl":  # nothing there to read: a dangling link reads as refused or missing
            with pytest.raises(UnsafePathError, match="refuses to read"):
                read_text(tmp_path / name)
    assert precious.read_text() == "keep me\n" and not (tmp_path / "nowhere.jsonl").exists()
    assert append_text(tmp_path / "own.jsonl", "a\n") and append_text(tmp_path / "own.jsonl", "b\n")
    assert read_text(tmp_path / "own.jsonl") == "a\nb\n" and read_text(tmp_path / "missing.jsonl") is None


@pytest.mark.parametrize("plant", ["symlink", "hardlink"])
def test_the_judge_verdict_cache_is_never_read_or_appended_through_a_link(tmp_path, elsewhere, plant):
    """Before: ``JudgeCache`` read the link's target as a cache and appended verdict lines to it."""
    from relaylens.scoring.judge import Judge

    class Stub:
        model_id = "stub"

        def complete(self, system, user):
            return '{"correct": true}'

    precious = elsewhere / "precious.txt"
    cache = tmp_path / "run" / "judge_cache_loc.jsonl"
    cache.parent.mkdir()
    cache.symlink_to(precious) if plant == "symlink" else os.link(precious, cache)
    with pytest.raises(UnsafePathError, match="judge_cache_loc.jsonl"):
        Judge(Stub(), cache_path=cache).judge(RECORD, "Biscuit")
    assert precious.read_text() == "keep me\n"


def test_run_judge_caches_are_refused_through_a_link(tmp_path, elsewhere):
    """``relaylens run --judge-*``: the run's caches (here the checklist cache of ``--judge-model stub``)."""
    from relaylens.experiments.config import RunConfig
    from relaylens.experiments.judges import make_judge

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "judge_cache_checklist.jsonl").symlink_to(elsewhere / "precious.txt")
    with pytest.raises(UnsafePathError, match="judge_cache_checklist.jsonl"):
        make_judge(RunConfig(judge_model="stub"), run_dir)
    assert _snapshot(elsewhere) == {"precious.txt": b"keep me\n"}


def test_the_sweep_attempts_log_is_never_appended_through_a_link(tmp_path, elsewhere):
    """Before: ``run_shard`` appended its attempt line to the link's target, then ran the shard."""
    from relaylens.experiments.sweep import attempts_path, run_shard

    run_dir = tmp_path / "run"
    attempts = attempts_path(run_dir, 0, 2)
    attempts.parent.mkdir(parents=True)
    attempts.symlink_to(elsewhere / "precious.txt")
    with pytest.raises(UnsafePathError, match="attempts.jsonl"):
        run_shard(None, None, 0, 2, str(run_dir))  # refused before the shard runs (spec and config unused)
    assert _snapshot(elsewhere) == {"precious.txt": b"keep me\n"}


def test_the_sweep_refuses_a_linked_shards_folder(tmp_path, elsewhere):
    from relaylens.experiments.sweep import run_shard

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "shards").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="shards"):
        run_shard(None, None, 0, 2, str(run_dir))
    assert _snapshot(elsewhere) == {"precious.txt": b"keep me\n"}


# --------------------------------------------------------------------------------------------- item 2: folders
def test_safe_subdir_refuses_any_link_below_the_base(tmp_path, elsewhere):
    base = tmp_path / "run"
    base.mkdir()
    (base / "figures").symlink_to(elsewhere, target_is_directory=True)
    (base / "real").mkdir()
    (base / "real" / "deep").symlink_to(elsewhere, target_is_directory=True)
    (base / "file").write_text("x")
    for parts in (("figures",), ("figures", "sub"), ("real", "deep"), ("real", "deep", "more"), ("file",)):
        with pytest.raises(UnsafePathError, match="Fix:"):
            safe_subdir(base, *parts)
        with pytest.raises(UnsafePathError):
            check_below(base, base.joinpath(*parts, "x.json"))
    assert safe_subdir(base, "real", "new").is_dir() and not (elsewhere / "sub").exists()
    assert _snapshot(elsewhere) == {"precious.txt": b"keep me\n"}
    linked_base = tmp_path / "base-link"  # the run directory itself may be reached through a link
    linked_base.symlink_to(base, target_is_directory=True)
    assert safe_subdir(linked_base, "real", "new") == linked_base / "real" / "new"


def test_figures_are_never_written_into_a_linked_figures_folder(run, elsewhere):
    """Before: ``relaylens figures`` followed ``figures/`` and replaced same-named files there (and locked it)."""
    from relaylens.reporting.figures import write_figures

    (elsewhere / "index.json").write_text("theirs\n")
    (run / "figures").symlink_to(elsewhere, target_is_directory=True)
    before = _snapshot(elsewhere)
    with pytest.raises(UnsafePathError, match="figures"):
        write_figures(run, formats=["png"])
    assert _snapshot(elsewhere) == before and not list(elsewhere.glob(".*"))
    (run / "figures").unlink()
    (run / "out").mkdir()
    (run / "out" / "figs").symlink_to(elsewhere, target_is_directory=True)  # a link deeper below the run directory
    with pytest.raises(UnsafePathError, match="figs"):
        write_figures(run, formats=["png"], out=run / "out" / "figs")
    assert _snapshot(elsewhere) == before


def test_units_are_never_written_or_deleted_through_a_linked_units_folder(run, tmp_path):
    outside = tmp_path / "outside-units"
    (run / "units").rename(outside)
    (run / "units").symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    with pytest.raises(UnsafePathError, match="units"):
        RunStore.create_or_open(run, manifest())
    store = RunStore.open(run)
    with pytest.raises(UnsafePathError, match="units"):
        fill(store, ["r3"])
    with pytest.raises(UnsafePathError, match="units"):
        store.remove_unit(UnitKey("r1", "bm25", 0.1))
    assert _snapshot(outside) == before


def test_learned_geometry_force_never_deletes_through_a_linked_units_folder(run, tmp_path):
    """Before: ``learned_geometry --force`` (``_discard_all`` / ``_discard_evaluations``) deleted ``units/*.json.gz``
    of the link's target."""
    from relaylens.experiments import learned_run

    outside = tmp_path / "outside-units"
    (run / "units").rename(outside)
    (run / "units").symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    store = RunStore.open(run)
    with pytest.raises(UnsafePathError, match="units"):
        learned_run._discard_all(store, run)
    with pytest.raises(UnsafePathError, match="units"):
        learned_run._discard_evaluations(store, UnitKey("r1", "bm25", 0.1))
    assert _snapshot(outside) == before and len(before) == 2


def test_views_are_never_written_into_a_linked_views_folder(run, elsewhere):
    from relaylens.results.views import write_view

    (run / "views").symlink_to(elsewhere, target_is_directory=True)
    view = {"record_id": "r1", "selector": "bm25", "budget": 0.1, "tokens": [], "gold": [], "kept": [],
            "attention": {}}
    with pytest.raises(UnsafePathError, match="views"):
        write_view(run, view)
    assert _snapshot(elsewhere) == {"precious.txt": b"keep me\n"}


@pytest.mark.parametrize("where", ["shards", "shards/0-of-2"])
def test_shard_directories_are_never_made_through_a_link(tmp_path, elsewhere, where):
    """``relaylens run --shard auto`` and the sweep write ``RUN_DIR/shards/I-of-N``: a link at either level is
    refused, never written through."""
    run_dir = tmp_path / "run"
    (run_dir / where).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / where).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="shards"):
        RunStore.create_or_open(run_dir / "shards" / "0-of-2", manifest())
    assert _snapshot(elsewhere) == {"precious.txt": b"keep me\n"}
