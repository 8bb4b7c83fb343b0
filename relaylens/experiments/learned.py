"""Learned geometry (``relaylens run learned_geometry``): fit the geometry family's parameters to the model's own
preference, then compare the learned map with ``original`` and ``relay`` on held-out records.

Flow:

1. **Split** (:func:`split_records`): records are grouped by cluster (``cluster_id``, else the record id: a cluster
   never straddles the split), groups are ordered by ``sha256(f"{seed}:{cluster}")`` and the whole groups whose
   sizes add up nearest ``round(train_fraction * n)`` records go to *train*, earliest groups first
   (:func:`train_clusters`; with one record per cluster, the first ``round(train_fraction * n)``); the rest is
   *test*. Same records and seed, same split; the split is stored in the manifest's plan and in
   ``learned_geometry.json``.
2. **Prepare**: one prefill and one selection per record (the spec's single selector and budget); only the kept keys
   and values stay in memory (:func:`relaylens.generation.cache.keep_selected`). No gradient ever reaches the
   history: keys and values are fixed, only their positions move.
3. **Train** (:func:`train`): parameters of :mod:`relaylens.conditions.family` shared ``global``, per ``layer``
   (default) or per ``head``, starting at RoPERelay (``b = s = alpha = 1``, a point at every sharing level).
   ``b`` and ``s`` are optimised as logarithms (always positive), ``alpha`` directly, clipped to ``[0, 1]`` after
   every step (so positions stay strictly increasing). Each step takes ``batch_records`` train records (a seeded
   draw per step), teacher-forces the first ``max_answer_tokens`` tokens of the reference answer after the question
   and ascends the mean per-token log-likelihood with Adam (float64; one question-plus-answer pass and one backward
   pass per record, no weight gradients). Every step rewrites the run's one training unit (the ``geometry`` table:
   parameters, the batch's log-likelihood, seconds, and Adam's moments), so a killed run resumes at its last step;
   every ``eval_every`` steps (and at 0 and the end) the mean log-likelihood of every test record and of every train
   record is recorded too (one pass per record, no gradients).
4. **Save**: ``RUN_DIR/learned_geometry.json`` (parameters, sharing, model, selector, budget, split): the condition
   ``learned:RUN_DIR`` anywhere else (:class:`relaylens.conditions.family.Learned`; the runner refuses another
   model, selector or budget, and records of its train split).
5. **Evaluate** every test record under ``original``, ``relay`` and the learned map (``learned``) with the same
   selection: answers, contains / F1, the evidence probes, ``answer_loglik`` scores and (``SPEC.sensitivity``) the
   positional sensitivity readout, committed as ordinary units.

Example (the split):
    >>> from relaylens.datasets.records import Record
    >>> recs = [Record(f"r{i}", "q", ("a",), "single-session-user", None, (), (), False) for i in range(6)]
    >>> train, test = split_records(recs, seed=0, train_fraction=0.5)
    >>> len(train), len(test), sorted(r.record_id for r in train) == sorted(r.record_id for r in train[:3])
    (3, 3, True)
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from relaylens.conditions.family import (
    LEARNED_FILE,
    PARAMETERS,
    POSITION_RANGE,
    RANGES,
    SHARING,
    Learned,
    family_coordinates,
)
from relaylens.conditions.learned_fit import FIT_FIELDS as SHARED_FIT_FIELDS
from relaylens.conditions.learned_fit import check_learned_model, check_learned_settings, learned_fit
from relaylens.conditions.scoped import Scoped, get_condition
from relaylens.errors import NonFiniteError, RelaylensError, shown
from relaylens.results.atomic import write_atomic
from relaylens.results.store import manifest_section

#: the Adam hyperparameters besides the learning rate
BETAS, EPS = (0.9, 0.999), 1e-8


@dataclass(frozen=True)
class LearnOptions:
    """The options of ``learned_geometry`` (CLI: ``--steps``, ``--learning-rate``, ``--sharing``, ``--batch-records``,
    ``--eval-every``, ``--train-fraction``, ``--answer-tokens``; the split and the draws use ``--seed``).

    Attributes:
        steps: Adam steps (default 40).
        learning_rate: Adam step size in the optimised coordinates (``log b``, ``log s``, ``alpha``; default 0.05).
        sharing: ``global``, ``layer`` (default) or ``head``.
        batch_records: train records per step (default 8; 0: all of them).
        eval_every: steps between evaluations of the test log-likelihood (default 10; also at 0 and the end).
        train_fraction: share of the records (whole clusters) that train (default 0.5).
        max_answer_tokens: reference-answer tokens teacher-forced per record (default 16).
    """

    steps: int = 40
    learning_rate: float = 0.05
    sharing: str = "layer"
    batch_records: int = 8
    eval_every: int = 10
    train_fraction: float = 0.5
    max_answer_tokens: int = 16

    def __post_init__(self) -> None:
        checks = [(isinstance(self.steps, int) and self.steps >= 0, "steps must be a whole number >= 0"),
                  (math.isfinite(self.learning_rate) and self.learning_rate > 0, "learning_rate must be positive"),
                  (self.sharing in SHARING, f"sharing must be one of {', '.join(SHARING)}"),
                  (isinstance(self.batch_records, int) and self.batch_records >= 0,
                   "batch_records must be >= 0 (0: all)"),
                  (isinstance(self.eval_every, int) and self.eval_every >= 1, "eval_every must be >= 1"),
                  (0.0 < self.train_fraction < 1.0, "train_fraction must lie strictly between 0 and 1"),
                  (isinstance(self.max_answer_tokens, int) and self.max_answer_tokens >= 1,
                   "max_answer_tokens must be >= 1")]
        for ok, what in checks:
            if not ok:
                raise RelaylensError(f"learned_geometry: {what}; got {asdict(self)}")

    def replace(self, **changes) -> LearnOptions:
        """A copy with the given options changed (``None`` values ignored), validated again."""
        return LearnOptions(**(asdict(self) | {k: v for k, v in changes.items() if v is not None}))

    def eval_steps(self) -> list[int]:
        return sorted({0, self.steps, *range(self.eval_every, self.steps, self.eval_every)})


def split_records(records: list, seed: int, train_fraction: float) -> tuple[list, list]:
    """``(train, test)``: whole clusters, ordered by ``sha256(f"{seed}:{cluster}")``, whose sizes add up as close to
    ``round(train_fraction * n)`` records as whole clusters allow (:func:`train_clusters`; never every record, never
    none) go to train (see the module docstring). Refuses duplicated record ids, and data with a single cluster.

    >>> from relaylens.datasets.records import Record
    >>> recs = [Record(f"r{i}", "q", ("a",), "single-session-user", None, (), (), False, cluster_id=c)
    ...         for i, c in enumerate("aaaaaaab")]                      # one cluster of 7, one of 1
    >>> [len(side) for side in split_records(recs, seed=0, train_fraction=0.5)]
    [1, 7]
    """
    seen: set[str] = set()
    for record in records:
        if record.record_id in seen:
            raise RelaylensError(f"learned_geometry: the data holds record id {record.record_id!r} twice, so it could "
                                 "sit in train and test at once. Fix: give every record its own id")
        seen.add(record.record_id)
    if len(records) < 2:
        raise RelaylensError(f"learned_geometry needs at least 2 records (one to train on, one to test); got "
                             f"{len(records)}. Fix: pass --limit 2 or more")
    groups: dict[str, list] = {}
    for record in records:
        groups.setdefault(record.cluster, []).append(record)
    if len(groups) < 2:
        raise RelaylensError(f"learned_geometry: all {len(records)} records form one cluster, and a cluster never "
                             "straddles the split. Fix: use records from more than one cluster")
    order = sorted(groups, key=lambda c: hashlib.sha256(f"{seed}:{c}".encode()).hexdigest())
    target = min(max(round(train_fraction * len(records)), 1), len(records) - 1)
    chosen = train_clusters([len(groups[c]) for c in order], target)
    train = [r for i, c in enumerate(order) if i in chosen for r in groups[c]]
    test = [r for i, c in enumerate(order) if i not in chosen for r in groups[c]]
    overlap = {r.record_id for r in train} & {r.record_id for r in test}
    if overlap or not train or not test:  # cannot happen; kept as the contract's guard
        raise RelaylensError(f"learned_geometry: the split is not a partition (overlap {sorted(overlap)[:3]}, "
                             f"{len(train)} train, {len(test)} test records)")
    return train, test


def train_clusters(sizes: list[int], target: int) -> set[int]:
    """Indices of the clusters (``sizes`` in seeded order) that go to train: a subset whose total is the reachable
    total nearest ``target`` among ``1 .. n - 1`` (ties: the smaller total), and among the subsets with that total the
    one that takes clusters earliest in the order. With clusters of one record each, the first ``target`` clusters.

    A subset-sum over the sizes (reachable totals kept as bit sets, one per cluster), so a split is found whenever
    one exists: uneven clusters never overshoot the fraction or leave test empty.

    >>> sorted(train_clusters([1, 5, 1, 1, 1, 1], 5)), sorted(train_clusters([1, 1, 1, 1], 2))
    ([1], [0, 1])
    """
    total = sum(sizes)
    reachable = [1]  # reachable[i]: bit t set when some subset of the first i clusters adds up to t
    for size in sizes:
        reachable.append(reachable[-1] | (reachable[-1] << size))
    candidates = [t for t in range(1, total) if reachable[-1] >> t & 1]
    best = min(candidates, key=lambda t: (abs(t - target), t))
    chosen, left = set(), best
    for index in range(len(sizes) - 1, -1, -1):  # leave a later cluster out whenever the rest still reach the total
        if not reachable[index] >> left & 1:
            chosen.add(index)
            left -= sizes[index]
    return chosen


# --------------------------------------------------------------------------------------------------- parameters

def initial_raw(sharing: str, num_layers: int, num_kv_heads: int) -> dict[str, torch.Tensor]:
    """RoPERelay in the optimised coordinates: ``log b = log s = 0``, ``alpha = 1``, shaped for ``sharing``."""
    shape = {"global": (), "layer": (num_layers,), "head": (num_layers, num_kv_heads)}[sharing]
    return {"b": torch.zeros(shape, dtype=torch.float64), "s": torch.zeros(shape, dtype=torch.float64),
            "alpha": torch.ones(shape, dtype=torch.float64)}


def family_values(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``b = exp(raw b)``, ``s = exp(raw s)``, ``alpha`` as is (autograd kept)."""
    return {"b": torch.exp(raw["b"]), "s": torch.exp(raw["s"]), "alpha": raw["alpha"]}


def parameter_rows(values: dict[str, torch.Tensor], step: int, key: dict, prefix: str = "") -> list[dict]:
    """Geometry-table rows of ``values`` at ``step`` (``layer``/``head`` ``-1`` where shared)."""
    rows = []
    for name in PARAMETERS:
        tensor = values[name].detach()
        flat = tensor.reshape(-1).tolist()
        for index, value in enumerate(flat):
            layer = -1 if tensor.dim() == 0 else (index // tensor.shape[1] if tensor.dim() == 2 else index)
            head = index % tensor.shape[1] if tensor.dim() == 2 else -1
            rows.append(key | {"step": step, "layer": layer, "head": head, "metric": prefix + name,
                               "value": float(value)})
    return rows


def rows_to_tensors(rows: list[dict], step: int, shape_of: dict[str, tuple], prefix: str = "") -> dict[str,
                                                                                                       torch.Tensor]:
    """The inverse of :func:`parameter_rows` for one step (missing: KeyError)."""
    out = {}
    for name in PARAMETERS:
        tensor = torch.zeros(shape_of[name], dtype=torch.float64)
        picked = [r for r in rows if r["step"] == step and r["metric"] == prefix + name]
        if len(picked) != max(tensor.numel(), 1):
            raise KeyError(f"{prefix}{name} at step {step}")
        for r in picked:
            index = () if tensor.dim() == 0 else (r["layer"],) if tensor.dim() == 1 else (r["layer"], r["head"])
            tensor[index] = r["value"]
        out[name] = tensor
    return out


def scalar_row(key: dict, step: int, metric: str, value: float) -> dict:
    return key | {"step": step, "layer": -1, "head": -1, "metric": metric, "value": float(value)}


# ------------------------------------------------------------------------------------------------------ training

@dataclass
class Prepared:
    """One record ready for training or evaluation: its prompt, compacted prefill and selection (a ``UnitWork``)."""

    record: object
    prompt: object
    prefill: object  # a compacted PrefillResult (kept states only)
    unit: object  # relaylens.experiments.units.UnitWork
    prefill_s: float
    answer_ids: torch.Tensor  # [A] (empty for records without a reference answer)


def record_loglik(model, item: Prepared, values: dict, factors, window_mode: str) -> torch.Tensor:
    """Mean per-token log-likelihood of the record's answer under the family at ``values`` (keeps the graph)."""
    from relaylens.generation.single import answer_log_probs  # noqa: PLC0415 - import cost: transformers loads on first use

    coords = family_coordinates(item.unit.selection, values["b"], values["s"], values["alpha"], label="learned")
    return answer_log_probs(model, item.prefill, item.unit.selection, coords, item.prompt.question_ids, item.answer_ids,
                            factors, window_mode).mean()


def mean_loglik(model, items: list[Prepared], values: dict, factors, window_mode: str) -> float:
    with torch.no_grad():
        detached = {k: v.detach() for k, v in values.items()}
        return float(sum(float(record_loglik(model, item, detached, factors,
                                             window_mode)) for item in items) / len(items))


def evaluation_rows(model, train_items, test_items, values, factors, window_mode: str, key: dict,
                    step: int) -> list[dict]:
    """``test_loglik`` and ``train_all_loglik`` (every test / train record) at ``values``, as geometry rows."""
    return [scalar_row(key, step, "test_loglik", mean_loglik(model, test_items, values, factors, window_mode)),
            scalar_row(key, step, "train_all_loglik", mean_loglik(model, train_items, values, factors, window_mode))]


def batch_of(step: int, count: int, size: int, seed: int) -> list[int]:
    """The train records of ``step``: a seeded draw without replacement (all of them when ``size`` is 0 or >= count)."""
    if size == 0 or size >= count:
        return list(range(count))
    generator = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(step))
    return sorted(torch.randperm(count, generator=generator)[:size].tolist())


def adam_step(raw: dict, grads: dict, m: dict, v: dict, t: int, learning_rate: float) -> None:
    """One Adam *ascent* step in place (``t``: the step number from 1); ``alpha`` clipped to ``[0, 1]``."""
    for name in PARAMETERS:
        g = grads[name]
        m[name] = BETAS[0] * m[name] + (1 - BETAS[0]) * g
        v[name] = BETAS[1] * v[name] + (1 - BETAS[1]) * g * g
        m_hat = m[name] / (1 - BETAS[0] ** t)
        v_hat = v[name] / (1 - BETAS[1] ** t)
        raw[name] = raw[name] + learning_rate * m_hat / (v_hat.sqrt() + EPS)
    raw["alpha"] = raw["alpha"].clamp(0.0, 1.0)


def check_step(step: int, loglik: float, grads: dict, values: dict, options: LearnOptions) -> None:
    """Refuse a diverged step before it is committed: a non-finite log-likelihood or gradient, or parameters that
    left their ranges (``0 < b, s < 2**24``: ``exp`` of a huge logarithm overflows or underflows). The run keeps the
    last good step, and a re-run with a lower learning rate (and ``--force``) trains again from RoPERelay
    (:func:`relaylens.experiments.learned_run.run_learned_geometry` restarts when the learning rate changes)."""
    problems = [] if math.isfinite(loglik) else [f"the batch's answer log-likelihood is {loglik}"]
    problems += [f"the gradient of {name} is not finite" for name in PARAMETERS
                 if not bool(torch.isfinite(grads[name]).all())]
    for name in PARAMETERS:
        value = values[name].detach()
        low, high = (0.0, 1.0) if name == "alpha" else (0.0, float(POSITION_RANGE))
        bad = ~torch.isfinite(value) | (value < low if name == "alpha" else value <= low) | \
            (value > high if name == "alpha" else value >= high)
        if bool(bad.any()):
            problems.append(f"{name} left {RANGES[name]} ({float(value[bad].reshape(-1)[0]):g})")
    if problems:
        lower = options.learning_rate / 10
        raise NonFiniteError(f"learned_geometry: training diverged at step {step + 1} of {options.steps}: "
                             f"{'; '.join(problems)}. That step was not committed (the run keeps step {step}). Fix: "
                             f"re-run with a lower --learning-rate (e.g. {lower:g}) and --force: training starts again "
                             "from RoPERelay")


def train(model, factors, train_items: list[Prepared], test_items: list[Prepared], options: LearnOptions, seed: int,
          key: dict, rows: list[dict], window_mode: str, commit, tick=None) -> dict[str, torch.Tensor]:
    """Run (or resume from ``rows``, the training unit's geometry rows) the Adam ascent; ``commit(rows)`` rewrites the
    training unit after every step; ``tick(step, text)`` reports progress. Returns the final family values."""
    from relaylens.generation.single import frozen_weights  # noqa: PLC0415 - import cost: transformers loads on first use

    selection = train_items[0].unit.selection
    raw = initial_raw(options.sharing, selection.num_layers, selection.num_kv_heads)
    shapes = {name: tuple(t.shape) for name, t in raw.items()}
    m = {name: torch.zeros_like(t) for name, t in raw.items()}
    v = {name: torch.zeros_like(t) for name, t in raw.items()}
    done = max((r["step"] for r in rows if r["metric"] == "b"), default=None)
    if done is not None:  # resume: the parameters and Adam's moments of the last committed step
        values = rows_to_tensors(rows, done, shapes)
        raw = {"b": values["b"].log(), "s": values["s"].log(), "alpha": values["alpha"]}
        if done > 0:
            m, v = rows_to_tensors(rows, done, shapes, "adam_m:"), rows_to_tensors(rows, done, shapes, "adam_v:")
    evals = options.eval_steps()
    start = 0 if done is None else done
    if done is None:
        values = family_values(raw)
        rows = parameter_rows(values, 0, key) + evaluation_rows(model, train_items, test_items, values, factors,
                                                                 window_mode, key, 0)
        commit(rows)
    for step in range(start, options.steps):
        started = time.perf_counter()
        batch = [train_items[i] for i in batch_of(step, len(train_items), options.batch_records, seed)]
        leaves = {name: t.clone().requires_grad_() for name, t in raw.items()}
        total = 0.0
        with torch.enable_grad(), frozen_weights(model):
            for item in batch:
                objective = record_loglik(model, item, family_values(leaves), factors, window_mode)
                (objective / len(batch)).backward()
                total += float(objective.detach())
                if tick:
                    tick(step, f"step {step + 1}/{options.steps}: {shown(item.record.record_id)}")
        grads = {name: leaf.grad.detach().clone() for name, leaf in leaves.items()}
        adam_step(raw, grads, m, v, step + 1, options.learning_rate)
        values = family_values(raw)
        check_step(step, total / len(batch), grads, values, options)  # a diverged step is never committed
        rows = [r for r in rows if not r["metric"].startswith(("adam_m:", "adam_v:"))]
        rows.append(scalar_row(key, step, "train_loglik", total / len(batch)))
        rows.append(scalar_row(key, step, "step_s", time.perf_counter() - started))
        rows += parameter_rows(values, step + 1, key)
        rows += parameter_rows({n: m[n] for n in PARAMETERS}, step + 1, key, "adam_m:")
        rows += parameter_rows({n: v[n] for n in PARAMETERS}, step + 1, key, "adam_v:")
        if step + 1 in evals:
            if tick:
                tick(step, f"step {step + 1}/{options.steps}: log-likelihood of every record")
            rows += evaluation_rows(model, train_items, test_items, values, factors, window_mode, key, step + 1)
        commit(rows)
    return family_values(raw)


FIT_FIELDS = SHARED_FIT_FIELDS
"""The settings a learned geometry's fit depended on besides the model (recorded in ``learned_geometry.json`` under
``fit``; ``learned:RUN_DIR`` elsewhere must match every one of them and the model, :func:`check_learned_conditions`;
the integrations check them with the same code, :mod:`relaylens.conditions.learned_fit`)."""


def fit_settings(spec, run: dict) -> dict:
    """The :data:`FIT_FIELDS` of a run: its single selector and budget, that selector's options, protected framing,
    the resolved prompt mode, the evidence granularity and the window mode (``run``: the manifest's ``config.run``)."""
    selector = spec.selectors[0] if len(spec.selectors) == 1 else list(spec.selectors)
    budget = float(spec.budgets[0]) if len(spec.budgets) == 1 else [float(b) for b in spec.budgets]
    options = spec.selector_options.get(selector, {}) if isinstance(selector, str) else spec.selector_options
    return {"selector": selector, "budget": budget, "selector_options": json.loads(json.dumps(options, sort_keys=True)),
            "protect_instructions": bool(spec.protect_instructions), "prompt_mode": spec.prompt_mode,
            "granularity": spec.granularity, "window_mode": run.get("window_mode", "condition")}


def learned_file(out: Path, values: dict, options: LearnOptions, manifest: dict, spec, train_ids, test_ids,
                 seed: int, num_layers: int, num_kv_heads: int) -> Path:
    """Write ``RUN_DIR/learned_geometry.json`` (atomically): what ``learned:RUN_DIR`` reads; ``fit`` holds the
    settings the fit depended on (:func:`fit_settings`)."""
    fit = fit_settings(spec, manifest_section(manifest, "config", "run"))
    doc = {"format": 2, "analysis": "learned_geometry", "sharing": options.sharing,
           "parameters": {name: values[name].detach().tolist() for name in PARAMETERS},
           "num_layers": num_layers, "num_kv_heads": num_kv_heads, "model": manifest.get("model"),
           "selector": spec.selectors[0], "budget": float(spec.budgets[0]), "prompt_mode": spec.prompt_mode,
           "fit": fit, "options": asdict(options), "seed": seed, "train_records": list(train_ids),
           "test_records": list(test_ids)}
    return write_atomic(out / LEARNED_FILE, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def learned_parts(condition) -> list[Learned]:
    """The ``learned:RUN_DIR`` parts of a parsed condition (itself, or a scoped condition's inside and base)."""
    parts = [condition.inner, condition.base] if isinstance(condition, Scoped) else [condition]
    return [p for p in parts if isinstance(p, Learned)]


def pin_learned_conditions(spec, manifest: dict):
    """Read every ``learned:RUN_DIR`` of ``spec`` once and pin it: the manifest records, per label, the learned
    file's SHA-256 and parameters (``config.learned``; resume and merge refuse another content, even with ``--force``
    once units exist: :meth:`relaylens.results.store.RunStore.create_or_open`), and the returned spec carries the
    parsed conditions, so every record of the run uses exactly those parameters, whatever happens to the file.
    A spec without learned conditions is returned as it is and the manifest is left unchanged."""
    pinned, pins = [], {}
    for entry in spec.conditions:
        condition = get_condition(entry)
        parts = learned_parts(condition)
        for part in parts:
            known = pins.get(part.label)
            if known is not None and known["sha256"] != part.sha256:
                raise RelaylensError(f"condition {part.label} changed while the run's conditions were read (sha256 "
                                     f"{known['sha256'][:12]} -> {part.sha256[:12]}). Fix: do not retrain into "
                                     f"{part.run_dir} while a run reads it; start again")
            pins[part.label] = {"sha256": part.sha256, "sharing": part.info.get("sharing"),
                                "parameters": {p: part.info["parameters"][p] for p in PARAMETERS}}
        pinned.append(condition if parts else entry)
    if not pins:
        return spec
    manifest.setdefault("config", {})["learned"] = pins
    return spec.replace(conditions=tuple(pinned))


_learned_fit = learned_fit  # what the fit depended on (relaylens.conditions.learned_fit, shared with the integrations)


def _check_model(part: Learned, manifest: dict) -> None:
    """The model: every hash both sides record agrees (weights, config); without a common hash, the model names."""
    check_learned_model(part, manifest.get("model") or {}, "this run")


def _check_fit(part: Learned, spec, manifest: dict) -> None:
    """Every :data:`FIT_FIELDS` setting of the fit equals this run's, or the condition is refused naming each
    difference (a setting the learned file does not record counts as a difference)."""
    learned, here = _learned_fit(part), fit_settings(spec, manifest_section(manifest, "config", "run"))
    if isinstance(here["selector"], list) or isinstance(here["budget"], list) or learned.get("budget") is None \
            or here["selector"] != learned.get("selector") or float(here["budget"]) != float(learned["budget"]):
        swept = {(s, float(b)) for s in spec.selectors for b in spec.budgets}
        shown = f"{learned.get('selector')} @ {float(learned['budget']):g}" if learned.get("budget") is not None \
            else f"{learned.get('selector')} @ an unrecorded budget"
        raise RelaylensError(f"condition {part.label} was learned on {shown}; this run sweeps "
                             f"{', '.join(f'{s} @ {b:g}' for s, b in sorted(swept))}. Fix: run it with --selector "
                             f"{learned.get('selector')} --budget {learned.get('budget')} only, or learn a geometry "
                             "for that selector and budget")
    check_learned_settings(part, {name: here[name] for name in FIT_FIELDS[2:]}, "this run")


def check_learned_conditions(spec, manifest: dict, record_ids: list[str]):
    """Pin every ``learned:RUN_DIR`` of ``spec`` (:func:`pin_learned_conditions`) and refuse one that was learned on
    another model, under other fit settings (:data:`FIT_FIELDS`: selector, budget, selector options, protected
    framing, prompt mode, granularity, window mode) or on these records; returns the pinned spec."""
    spec = pin_learned_conditions(spec, manifest)
    for condition in spec.conditions:
        for part in learned_parts(condition) if not isinstance(condition, str) else []:
            info, label = part.info, part.label
            _check_model(part, manifest)
            _check_fit(part, spec, manifest)
            overlap = sorted(set(info.get("train_records") or ()) & set(record_ids))
            if overlap:
                raise RelaylensError(f"condition {label} was trained on {len(overlap)} of this run's records (e.g. "
                                     f"{overlap[0]}): a train/test overlap. Fix: evaluate it on other records (its "
                                     f"test split: {len(info.get('test_records') or ())} records), or use other data")
    return spec
