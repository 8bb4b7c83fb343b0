"""Headline numbers of a real-records run, as docs/real-records.md and the results page quote them (not a test).

For every condition against original: accuracy under each answer metric (judge verdicts too, once `relaylens
judge` added them) and the final question token's gold evidence share (percentage points, averaged over layers and
query heads), paired per record, with 95% cluster-bootstrap intervals (10,000 resamples, seed 0); wins : losses;
answers cut by the 512-token limit; the gold evidence kept; per question type (relay - original, paired); Figure 6's
layer bands where the run probed them (`evidence_reading`: the `evidence_bands` table with its intervals); in a
dilation run, relay and key_only(k) against dilation(k) at each k; the time each record recorded (prefill,
selection, decoding; the wall time of a run that spans sessions is in the run notes of docs/real-records.md: unit
files carry no write time) and the machine each unit was computed on (its stamp; none in units written before
stamps).

    python scripts/real_records_summary.py figures/real_coordinate_ablation_qwen0.5b_8k
"""

from __future__ import annotations

import sys
from collections import Counter

import pandas as pd

from relaylens.reporting.figures.evidence_bands import evidence_band_table
from relaylens.reporting.summaries import accuracy_means, paired_deltas, record_evidence_share_pp, win_loss
from relaylens.results.store import RunStore, load_run


def main(run_dir: str) -> None:
    tables, _ = load_run(run_dir)
    answers = tables["answers"]
    print(f"{run_dir}: {tables['scores']['record_id'].nunique()} records, {len(tables['skipped'])} skipped")
    selectors = sorted(answers["selector"].unique())
    for selector in selectors:  # a multi-selector run (main_table): one block per selector, never pooled
        if len(selectors) > 1:
            print(f"\n===== selector {selector}")
        _selector_block({name: t[t["selector"] == selector] if "selector" in t else t for name, t in tables.items()})
    _bands_and_time(run_dir, tables)


def _selector_block(tables: dict) -> None:
    scores, answers = tables["scores"], tables["answers"]
    evidence = record_evidence_share_pp(tables)
    both = pd.concat([scores, evidence], ignore_index=True)
    judged = sorted(m for m in scores["metric"].unique()  # after `relaylens judge`
                    if m.startswith("judge") and not m.endswith("_failed"))
    metrics = ["contains", "f1", *judged, "evidence_share_pp"]
    means = accuracy_means(both, by=["condition"], metrics=metrics)
    deltas = paired_deltas(both, by=[], metrics=metrics)
    wl = win_loss(scores[scores["metric"] == "contains"], by=[])
    for m in metrics:
        print(f"\n{m}")
        for _, r in means[means["metric"] == m].iterrows():
            d = deltas[(deltas["metric"] == m) & (deltas["condition"] == r["condition"])]
            extra = ""
            if len(d):
                d = d.iloc[0]
                extra = f"  delta {d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
                if m == "contains":
                    w = wl[wl["condition"] == r["condition"]]
                    if len(w):
                        extra += f"  wins:losses {int(w.iloc[0]['wins'])}:{int(w.iloc[0]['losses'])}"
            print(f"  {r['condition']:<20} {r['mean']:.3f} [{r['low']:.3f}, {r['high']:.3f}]{extra}")
    print("\nhit the 512-token limit / empty answers, per condition")
    print(answers.groupby("condition").agg(hit_limit=("hit_limit", "mean"),
                                           empty=("answer", lambda a: (a.str.strip() == "").mean())).round(3))
    kept = answers.drop_duplicates("record_id")
    gold = kept[kept["gold_units_total"] > 0]
    print(f"\ngold evidence kept, of the {len(gold)} records with gold turns ({len(kept) - len(gold)} have none): "
          f"every gold turn in {(gold['gold_units_kept'] >= gold['gold_units_total']).sum()}, "
          f"at least one in {(gold['gold_units_kept'] > 0).sum()}")
    for metric in ["contains", *judged]:
        print(f"\n{metric} per question type (original -> relay, paired difference [95% interval], n)")
        chosen = scores[(scores["metric"] == metric) & scores["condition"].isin(["original", "relay"])]
        type_means = accuracy_means(chosen, by=["question_type", "condition"], metrics=[metric])
        type_deltas = paired_deltas(chosen, by=["question_type"], metrics=[metric])
        for _, d in type_deltas.iterrows():
            m = type_means[type_means["question_type"] == d["question_type"]].set_index("condition")["mean"]
            print(f"  {d['question_type']:<26} {m['original']:.2f} -> {m['relay']:.2f}  {d['mean']:+.3f} "
                  f"[{d['low']:+.3f}, {d['high']:+.3f}]  n = {int(d['n'])}")
    _dilation_block(both, metrics)


def _dilation_block(both: pd.DataFrame, metrics: list[str]) -> None:
    """The dilation run's comparison at each k: relay and key_only(k) against dilation(k) (original at k = 1), the
    paper's three-way comparison at a history k times longer."""
    ks = sorted(int(c[len("dilation("):-1]) for c in both["condition"].unique() if c.startswith("dilation("))
    if not ks:
        return
    print("\nat each dilation k: condition - dilation(k), paired [95% interval] (k = 1: original)")
    for k in [1, *ks]:
        reference, key_only = ("original", "key_only") if k == 1 else (f"dilation({k})", f"key_only({k})")
        chosen = both[both["condition"].isin([reference, key_only, "relay"])]
        means = accuracy_means(chosen, by=["condition"], metrics=metrics).set_index(["metric", "condition"])["mean"]
        deltas = paired_deltas(chosen, by=[], reference=reference, metrics=metrics)
        for _, d in deltas.iterrows():
            print(f"  k = {k:<3} {d['metric']:<18} {d['condition']:<13} {means[(d['metric'], reference)]:.3f} -> "
                  f"{means[(d['metric'], d['condition'])]:.3f}  {d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
                  f"  n = {int(d['n'])}")


def _bands_and_time(run_dir: str, tables: dict) -> None:
    answers = tables["answers"]
    kept = answers.drop_duplicates("record_id")
    bands = evidence_band_table(tables)
    bands = bands[bands["selector"] == "all"]
    if len(bands):
        print("\nFigure 6 per layer band: condition - original, pp [95% interval], wins:losses (original's level)")
    for _, b in bands.iterrows():
        print(f"  {b['probe_point']:<19} {b['quantity']:<25} {b['condition']:<9} {b['band']:<7} n = {b['n']:<4} "
              f"{b['delta_pp']:+.2f} [{b['delta_low']:+.2f}, {b['delta_high']:+.2f}]  {b['wins']}:{b['losses']}  "
              f"({b['original_pp']:.2f} -> {b['value_pp']:.2f})")
    print(f"\nprefill s per record: median {kept['prefill_s'].median():.1f}, mean {kept['prefill_s'].mean():.1f}")
    # one prefill per record and one selection per (record, selector, budget); a row's elapsed_s is its decoding
    # batch's time over the rows in that batch, so the rows' sum is the decoding (and probing) time
    selection = answers.groupby(["record_id", "selector", "budget"])["selection_s"].first().sum()
    per_record = kept.set_index("record_id")["prefill_s"]
    decode = answers["elapsed_s"].sum()
    busy = per_record.sum() + selection + decode
    print(f"recorded time: prefill {per_record.sum() / 3600:.2f} h, selection {selection / 3600:.2f} h, decoding with "
          f"its question passes and probes {decode / 3600:.2f} h")
    print(f"prefill + selection + decoding, as recorded per record: {busy / 3600:.2f} h for {len(per_record)} records "
          f"({len(per_record) / busy * 3600:.1f} per hour before writing)")
    # unit files carry no write time, and their mtimes are the checkout's in a fresh clone: the wall time of a run
    # that spans sessions is in docs/real-records.md's run notes, not here
    store = RunStore.open(run_dir)
    machines = Counter(_machine_text(store.unit_machine(path)) for path in store.unit_paths())
    print("units by the machine that computed them: " + "; ".join(f"{n} on {m}" for m, n in machines.most_common()))


def _machine_text(stamp: dict | None) -> str:
    if stamp is None:
        return "an unrecorded machine (written before units carried a machine stamp)"
    products = f", products: {stamp['products']}" if "products" in stamp else ""
    return f"{stamp['name']} ({stamp['device']}, {stamp['bf16']}, {stamp['threads']} threads{products})"


if __name__ == "__main__":
    main(sys.argv[1])
