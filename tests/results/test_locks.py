"""Lock files never follow links (issue 41, item 1): a run directory, a merge target or the model cache's lock folder
holding the lock name as a symbolic link (to a file, dangling, to a folder), a hard link or a FIFO is refused with one
line naming the path and the fix, for ``run``, ``merge``, ``figures``, ``report``, ``judge`` and ``model pull``; the
file the link points at is never truncated, written or created, and the link itself is left for the user to see."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from relaylens.errors import LockPathError
from relaylens.results.locks import LOCK_NAME, run_lock

PRECIOUS = "precious bytes that no lock may touch\n"


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A finished one-record run of the tiny model, and what it ran with."""
    from relaylens.datasets.synthetic import generate_records
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("locks")
    data = root / "records.json"
    data.write_text(json.dumps(generate_records(n=1, seed=3, history_tokens=600)))
    ws = {"root": root, "data": data, "model": tiny_model("llama", seed=0), "tokenizer": tiny_tokenizer()}
    ws["run"] = _run(ws, root / "run")
    return ws


def _run(ws, out: Path) -> Path:
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis

    spec = load_analysis("ordering").spec.replace(budgets=(0.4,), max_new_tokens=2, conditions=("original", "relay"),
                                                  replay_conditions=())
    config = RunConfig(model="tiny", data=str(ws["data"]), limit=1, out=str(out))
    return run_analysis(spec, config, progress=False, model_and_tokenizer=(ws["model"], ws["tokenizer"]))


def _plant(lock: Path, kind: str) -> Path:
    """Put ``kind`` under the lock name; returns the file an unsafe lock would write (the victim)."""
    victim = lock.parent.parent / f"victim-of-{lock.parent.name}-{kind}.txt"
    if kind in ("symlink", "hardlink"):
        victim.write_text(PRECIOUS)
    if kind in ("symlink", "dangling"):
        lock.symlink_to(victim)
    elif kind == "hardlink":
        os.link(victim, lock)
    elif kind == "folder-link":
        victim.mkdir()
        lock.symlink_to(victim, target_is_directory=True)
    elif kind == "fifo":
        os.mkfifo(lock)
    return victim


def _untouched(victim: Path, kind: str) -> None:
    if kind in ("symlink", "hardlink"):
        assert victim.read_text() == PRECIOUS, "the lock wrote through the link"
    elif kind == "dangling":
        assert not victim.exists() and not victim.is_symlink(), "the lock created the link's target"
    elif kind == "folder-link":
        assert list(victim.iterdir()) == []


@pytest.mark.parametrize("kind", ["symlink", "dangling", "hardlink", "folder-link", "fifo"])
def test_run_lock_refuses_every_lock_name_that_is_not_its_own_file(tmp_path, kind):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    victim = _plant(run_dir / LOCK_NAME, kind)
    with pytest.raises(LockPathError) as err:
        with run_lock(run_dir, "report"):
            pytest.fail("the block ran under a lock taken through a link")
    message = str(err.value)
    assert str(run_dir / LOCK_NAME) in message and "Fix: remove" in message and "\n" not in message, message
    _untouched(victim, kind)
    assert os.path.lexists(run_dir / LOCK_NAME), "the planted name is left for the user to see"


def _cli(*args):
    from typer.testing import CliRunner

    from relaylens.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "300"})


@pytest.mark.parametrize("command", ["run", "merge", "figures", "report", "judge"])
def test_no_command_writes_through_a_lock_symlink(ws, tmp_path, command):
    from relaylens.experiments.rejudge import rejudge_run

    run_dir = ws["run"]
    target = tmp_path / "merged" if command == "merge" else run_dir
    target.mkdir(exist_ok=True)
    victim = tmp_path / "victim.txt"
    victim.write_text(PRECIOUS)
    (target / LOCK_NAME).symlink_to(victim)
    try:
        if command in ("figures", "report"):  # the commands themselves: one error line, exit 2
            result = _cli(command, run_dir)
            assert result.exit_code == 2, result.output
            assert "refuses to lock" in result.stderr and str(target / LOCK_NAME) in result.stderr.replace("\n", "")
        else:
            with pytest.raises(LockPathError, match="refuses to lock"):
                if command == "run":
                    _run(ws, run_dir)  # a resumed run
                elif command == "merge":
                    from relaylens.results.shards import merge_runs

                    merge_runs([run_dir], target)
                else:
                    rejudge_run(run_dir, _NeverCalled(), "locked")
    finally:
        (target / LOCK_NAME).unlink()
    assert victim.read_text() == PRECIOUS, f"`{command}` wrote through the lock symlink"


class _NeverCalled:
    model_id = "never-called"

    def complete(self, system, user):
        raise AssertionError("the judge must not run without the lock")


@pytest.mark.parametrize("kind", ["symlink", "dangling"])
def test_model_pull_never_follows_its_lock_link(tmp_path, monkeypatch, kind):
    import relaylens.model.pull as pulling

    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path / "cache"))
    locks = tmp_path / "cache" / "locks"
    locks.mkdir(parents=True)
    victim = _plant(locks / "smollm2-135m-instruct.lock", kind)

    def no_download(*args, **kwargs):
        raise AssertionError("model pull went on without its lock")

    monkeypatch.setattr(pulling, "_download", no_download)
    with pytest.raises(LockPathError, match="`model pull` refuses to lock .*smollm2-135m-instruct.lock"):
        pulling.pull("smollm2-135m-instruct", progress=lambda line: None)
    _untouched(victim, kind)


def test_model_pull_lock_is_released_and_removed(tmp_path, monkeypatch):
    """The shared lock on the cache's lock folder: a second holder after the first works, nothing is left."""
    import relaylens.model.pull as pulling

    monkeypatch.setenv("RELAYLENS_CACHE", str(tmp_path / "cache"))
    for _ in range(2):
        with pulling._lock("smollm2-135m-instruct"):
            note = json.loads((tmp_path / "cache" / "locks" / "smollm2-135m-instruct.lock").read_text())
            assert note["pid"] == os.getpid() and note["command"] == "model pull"
    assert list((tmp_path / "cache" / "locks").iterdir()) == []


def test_atomic_writes_never_write_through_a_planted_temp_name(tmp_path):
    """The temp name of an atomic write is predictable (pid): a link planted there is replaced, not followed (the
    run store's writer, which reports, figures and tables use)."""
    from relaylens.results.atomic import write_atomic

    victim = tmp_path / "victim.txt"
    victim.write_text(PRECIOUS)
    target = tmp_path / "report.html"
    (tmp_path / f".tmp-report.html-{os.getpid()}").symlink_to(victim)
    write_atomic(target, "<html></html>")
    assert victim.read_text() == PRECIOUS and target.read_text() == "<html></html>" and not target.is_symlink()
