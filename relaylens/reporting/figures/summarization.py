"""Tables 10 and 11 (``relaylens/analyses/summarization.py``): HelloEval checklist scores of long summaries under
FullKV, SnapKV with original coordinates and SnapKV with RoPERelay.

Built from the run's tables only. Metrics are the checklist judge's (:mod:`relaylens.scoring.checklist`): ``quality``
(the weighted checklist score), ``factuality`` and ``coverage`` (weighted means over the accuracy / coverage items), all
0-1; a malformed judge reply is a recorded failure (``failures``), left out of the means, never a zero.

* Table 10: one row per setting (the ``full`` selector under ``original`` is FullKV; every other selector, budget and
  condition is its own row): ``n`` judged summaries, the three means, ``failures``, the mean generated length in
  tokens and the EOS rate (the share of summaries that ended with the model's end token rather than the limit).
* Table 11: the same means per source category (``question_type``: blogs, report, news, long_dialogue,
  academic_article).

Example:
    >>> import pandas as pd
    >>> scores = pd.DataFrame([dict(record_id="a", selector="snapkv", budget=0.1, condition="relay",
    ...                             question_type="news", metric=m, value=v)
    ...                        for m, v in (("quality", 0.5), ("factuality", 1.0), ("coverage", 0.25),
    ...                                     ("checklist_failed", 0.0))])
    >>> answers = pd.DataFrame([dict(record_id="a", selector="snapkv", budget=0.1, condition="relay",
    ...                              new_tokens=40, stop_reason="eos")])
    >>> table10({"scores": scores, "answers": answers})[["setting", "quality", "coverage", "eos_rate"]].values.tolist()
    [['snapkv 10% relay', 0.5, 0.25, 1.0]]
"""

from __future__ import annotations

import pandas as pd

from relaylens.reporting.figures.registry import register
from relaylens.results.tables import get_table
from relaylens.scoring.checklist import CHECKLIST_METRICS

FAILED = "checklist_failed"
SETTING = ["selector", "budget", "condition"]
TABLE10_COLUMNS = ["setting", *SETTING, "n", *CHECKLIST_METRICS, "failures", "mean_new_tokens", "eos_rate"]
TABLE11_COLUMNS = ["category", "setting", *SETTING, "n", *CHECKLIST_METRICS]


def needs_checklist(tables: dict) -> str | None:
    """Why Tables 10-11 cannot be built (no checklist-judged summaries), or None."""
    scores = get_table(tables, "scores")
    if not (scores["metric"] == FAILED + judge_suffix(tables)).any():
        return ("no checklist judge scores (the run was not judged). Fix: run the summarization analysis with "
                "--judge-model (with --judge-url, or --judge-model stub), or judge the finished run: `relaylens judge "
                "RUN_DIR --judge-model MODEL --max-tokens 2048`, then draw with --metric quality_NAME")
    return None


def setting_label(selector: str, budget: float, condition: str) -> str:
    """``FullKV`` for the keep-all selector under original coordinates, else ``selector budget condition``."""
    if selector == "full":
        return "FullKV" if condition == "original" else f"FullKV {condition}"
    shown = f"B{int(budget)}" if budget > 1 else f"{budget * 100:g}%"
    return f"{selector} {shown} {condition}"


def judge_suffix(tables: dict) -> str:
    """``""`` for the run's inline checklist judge, ``"_NAME"`` when the chosen metric is ``quality_NAME`` (a judge
    added by ``relaylens judge RUN_DIR --name NAME``; ``--metric quality_NAME`` picks it)."""
    chosen = (tables.get("metrics") or ("quality",))[0]
    return chosen[len("quality"):] if chosen.startswith("quality_") else ""


def _wide(tables: dict) -> pd.DataFrame:
    """One row per judged answer: key, category and the checklist metrics as columns."""
    suffix = judge_suffix(tables)
    scores = get_table(tables, "scores")
    scores = scores[scores["metric"].isin([f"{m}{suffix}" for m in (*CHECKLIST_METRICS, FAILED)])]
    scores = scores.assign(metric=scores["metric"].str.slice(0, -len(suffix) if suffix else None))
    wide = scores.pivot_table(index=["record_id", *SETTING, "question_type"], columns="metric", values="value",
                              aggfunc="first", dropna=False).reset_index()
    for column in (*CHECKLIST_METRICS, FAILED):
        if column not in wide:
            wide[column] = float("nan")
    keep = (wide["selector"] != "full") | (wide["condition"] == "original")  # keep-all under relay: same cache
    return wide[keep]


def _means(group: pd.DataFrame) -> dict:
    ok = group[group[FAILED] == 0]
    return {"n": len(ok), **{m: ok[m].mean() if len(ok) else float("nan") for m in CHECKLIST_METRICS}}


def _order(frame: pd.DataFrame) -> pd.DataFrame:
    rank = {"original": 0, "relay": 1}
    frame = frame.assign(_full=frame["selector"] != "full", _c=frame["condition"].map(lambda c: rank.get(c, 2)))
    return frame.sort_values(["_full", "selector", "budget", "_c", "condition"]).drop(columns=["_full", "_c"])


@register("table10", "table", "Table 10: summarization, HelloEval checklist quality / factuality / coverage (0-1), "
          "generated length and EOS rate", needs_checklist)
def table10(tables: dict) -> pd.DataFrame:
    """Table 10 from ``tables``: one row per setting; see the module docstring for the columns."""
    wide = _wide(tables)
    answers = get_table(tables, "answers")
    rows = []
    for (selector, budget, condition), g in wide.groupby(SETTING, sort=True):
        a = answers[(answers["selector"] == selector) & (answers["budget"] == budget)
                    & (answers["condition"] == condition)]
        rows.append({"setting": setting_label(selector, budget, condition), "selector": selector, "budget": budget,
                     "condition": condition, **_means(g), "failures": int((g[FAILED] == 1).sum()),
                     "mean_new_tokens": a["new_tokens"].mean() if len(a) else float("nan"),
                     "eos_rate": (a["stop_reason"] == "eos").mean() if len(a) else float("nan")})
    out = _order(pd.DataFrame(rows, columns=TABLE10_COLUMNS)).reset_index(drop=True) if rows else \
        pd.DataFrame(columns=TABLE10_COLUMNS)
    out.attrs["note"] = ("quality: weighted HelloEval checklist score; factuality / coverage: weighted means over the "
                         "accuracy / coverage items; failures: malformed judge replies (left out of the means)")
    return out


@register("table11", "table", "Table 11: summarization per source category, HelloEval quality / factuality / coverage",
          needs_checklist)
def table11(tables: dict) -> pd.DataFrame:
    """Table 11 from ``tables``: one row per (category, setting)."""
    wide = _wide(tables)
    rows = [{"category": category, "setting": setting_label(s, b, c), "selector": s, "budget": b, "condition": c,
             **_means(g)}
            for (category, s, b, c), g in wide.groupby(["question_type", *SETTING], sort=True)]
    if not rows:
        return pd.DataFrame(columns=TABLE11_COLUMNS)
    frame = _order(pd.DataFrame(rows, columns=TABLE11_COLUMNS))
    return frame.sort_values("category", kind="stable").reset_index(drop=True)
