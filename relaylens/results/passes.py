"""Judge passes over a run directory (``relaylens judge``): score rows added to committed units, shown only when the
pass is complete.

A pass rewrites the run's units one by one, so a killed pass leaves some units judged and others not. Every pass is
recorded in ``RUN_DIR/judges.json`` under its name, with the score ``metrics`` it adds and its ``status``:
``incomplete`` from its start (written before the first unit is rewritten), ``complete`` once every unit is. When
tables are built from the units (:meth:`relaylens.results.store.RunStore.build_tables`), the rows of a pass's metrics
are left out unless the pass is complete *and* covers every unit with answers (units committed after it, by a
resumed run or a later merge, are not judged yet) *and* got at least one verdict (a pass whose every verdict failed
is reported as failed, not as a judge the run lacks); :func:`hidden_passes` names each such pass, what it covers and
how to finish it (re-running the same ``relaylens judge`` resumes: verdicts are cached). Entries written before
passes recorded their metrics are left alone (their rows are shown, as before).

Example:
    >>> import tempfile
    >>> run = tempfile.mkdtemp()
    >>> begin_pass(run, "stub", ["judge_stub", "judge_stub_failed"], {"model_id": "stub"})
    >>> read_passes(run)["stub"]["status"]
    'incomplete'
    >>> finish_pass(run, "stub", {"answers": 4})
    >>> entry = read_passes(run)["stub"]; entry["status"], entry["answers"]
    ('complete', 4)
"""

from __future__ import annotations

import json
from pathlib import Path

from relaylens.errors import RelaylensError
from relaylens.results.atomic import write_atomic

__all__ = ["JUDGES", "read_passes", "begin_pass", "finish_pass", "pass_metrics", "hidden_passes", "failed_passes"]

JUDGES = "judges.json"


def read_passes(run_dir: str | Path) -> dict[str, dict]:
    """``{name: entry}`` of ``RUN_DIR/judges.json`` (``{}`` when the run was never judged)."""
    path = Path(run_dir) / JUDGES
    try:
        passes = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:
        raise RelaylensError(f"cannot read {path}: {type(exc).__name__}: {exc}; it records which judge passes are "
                             "complete. Fix: restore it, or re-run `relaylens judge RUN_DIR --name NAME` for each "
                             "judge the run had") from None
    if not isinstance(passes, dict) or not all(isinstance(e, dict) for e in passes.values()):
        raise RelaylensError(f"{path} is not a judge record (expected a JSON object of objects, one per judge "
                             f"name; got {type(passes).__name__}). Fix: restore it, or re-run `relaylens judge`")
    return passes


def _write(run_dir: str | Path, passes: dict) -> None:
    write_atomic(Path(run_dir) / JUDGES, json.dumps(passes, indent=2, sort_keys=True, default=str) + "\n",
                 sync_dir=True)


def begin_pass(run_dir: str | Path, name: str, metrics: list[str], info: dict) -> None:
    """Record pass ``name`` as ``incomplete`` with the score ``metrics`` it adds (before any unit is rewritten)."""
    passes = read_passes(run_dir)
    passes[name] = {**info, "metrics": sorted(metrics), "status": "incomplete"}
    _write(run_dir, passes)


def finish_pass(run_dir: str | Path, name: str, info: dict) -> None:
    """Mark pass ``name`` ``complete`` (after its last unit was rewritten), adding ``info`` to its entry."""
    passes = read_passes(run_dir)
    passes[name] = {**passes.get(name, {}), **info, "status": "complete"}
    _write(run_dir, passes)


def pass_metrics(passes: dict[str, dict]) -> dict[str, str]:
    """``{metric: pass name}`` over the passes that record their metrics."""
    return {m: name for name, e in passes.items() if isinstance(e.get("metrics"), list) for m in e["metrics"]
            if isinstance(m, str)}


def hidden_passes(passes: dict[str, dict], covered: dict[str, int], units: int) -> dict[str, str]:
    """``{name: why its scores are not shown}`` for the passes that are incomplete, do not cover all ``units``
    (units with answers) or failed every verdict; ``covered[name]``: how many of them carry the pass's rows for every
    answer."""
    hidden = {}
    for name in sorted({n for n in pass_metrics(passes).values()}):
        done, fix = covered.get(name, 0), (f"Fix: re-run `relaylens judge RUN_DIR --name {name}` with the same judge "
                                           "(cached verdicts are reused)")
        if passes[name].get("status") != "complete":
            hidden[name] = (f"judge pass {name} was interrupted ({done} of {units} units judged): its scores are not "
                            f"shown. {fix}")
        elif done < units:
            hidden[name] = (f"judge pass {name} covers {done} of {units} units (the others were committed after it): "
                            f"its scores are not shown. {fix}")
        elif _every_verdict_failed(passes[name]):
            answers = passes[name]["answers"]
            hidden[name] = (f"judge pass {name} failed: all {answers} of its verdicts failed (no reply parsed as a "
                            f"verdict; the replies are in judge_{name}_failures.json), so its scores hold failures "
                            "only. "
                            "Fix: judge again with a model or settings that answer in the template's format (a larger "
                            f"judge model, more --max-tokens): `relaylens judge RUN_DIR --name {name} --judge-model "
                            "...`")
    return hidden


def failed_passes(passes: dict[str, dict]) -> set[str]:
    """Names of the complete passes whose every verdict failed: their rows stay in the scores table (NaN verdicts,
    every failure counted, so a table built on them shows ``n = 0`` and the failures), and :func:`hidden_passes`
    names them as failed, never as a judge the run lacks."""
    return {name for name,
            entry in passes.items() if entry.get("status") == "complete" and _every_verdict_failed(entry)}


def _every_verdict_failed(entry: dict) -> bool:
    """A complete pass that judged answers and got no verdict at all: reported as failed, never as absent."""
    answers, failures = entry.get("answers"), entry.get("failures")
    return (isinstance(answers, int) and isinstance(failures, int) and not isinstance(answers, bool)
            and answers > 0 and failures >= answers)
