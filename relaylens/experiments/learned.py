"""Learned geometry (``relaylens run learned_geometry``): fit the geometry family's parameters to the model's own
preference, then compare the learned map with ``original`` and ``relay`` on held-out records.

Flow:

1. **Split** (:func:`split_records`): records are grouped by cluster (``cluster_id``, else the record id: a cluster
   never straddles the split), groups are ordered by ``sha256(f"{seed}:{cluster}")`` and whole groups go to
   *train* until it holds ``round(train_fraction * n)`` records; the rest is *test*. Same records and seed, same
   split; the split is stored in the manifest's plan and in ``learned_geometry.json``.
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

from relaylens.conditions.family import LEARNED_FILE, PARAMETERS, SHARING, Learned, family_coordinates
from relaylens.errors import RelaylensError, shown
from relaylens.results.tables import ANSWER_LOGLIK, TRAINING_UNIT

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
                  (isinstance(self.batch_records, int) and self.batch_records >= 0, "batch_records must be >= 0 (0: all)"),
                  (isinstance(self.eval_every, int) and self.eval_every >= 1, "eval_every must be >= 1"),
                  (0.0 < self.train_fraction < 1.0, "train_fraction must lie strictly between 0 and 1"),
                  (isinstance(self.max_answer_tokens, int) and self.max_answer_tokens >= 1, "max_answer_tokens must be >= 1")]
        for ok, what in checks:
            if not ok:
                raise RelaylensError(f"learned_geometry: {what}; got {asdict(self)}")

    def replace(self, **changes) -> LearnOptions:
        """A copy with the given options changed (``None`` values ignored), validated again."""
        return LearnOptions(**(asdict(self) | {k: v for k, v in changes.items() if v is not None}))

    def eval_steps(self) -> list[int]:
        return sorted({0, self.steps, *range(self.eval_every, self.steps, self.eval_every)})


def split_records(records: list, seed: int, train_fraction: float) -> tuple[list, list]:
    """``(train, test)``: whole clusters, ordered by ``sha256(f"{seed}:{cluster}")``, fill train up to
    ``round(train_fraction * n)`` records (see the module docstring). Refuses duplicated record ids."""
    seen: set[str] = set()
    for record in records:
        if record.record_id in seen:
            raise RelaylensError(f"learned_geometry: the data holds record id {record.record_id!r} twice, so it could sit "
                                 "in train and test at once. Fix: give every record its own id")
        seen.add(record.record_id)
    if len(records) < 2:
        raise RelaylensError(f"learned_geometry needs at least 2 records (one to train on, one to test); got "
                             f"{len(records)}. Fix: pass --limit 2 or more")
    groups: dict[str, list] = {}
    for record in records:
        groups.setdefault(record.cluster, []).append(record)
    order = sorted(groups, key=lambda c: hashlib.sha256(f"{seed}:{c}".encode()).hexdigest())
    target = min(max(round(train_fraction * len(records)), 1), len(records) - 1)
    train, test = [], []
    for cluster in order:
        (train if len(train) < target else test).extend(groups[cluster])
    if not test:
        raise RelaylensError("learned_geometry: every record landed in train (the records form one cluster). Fix: use "
                             "records from more than one cluster")
    overlap = {r.record_id for r in train} & {r.record_id for r in test}
    if overlap:  # cannot happen with unique ids; kept as the contract's guard
        raise RelaylensError(f"learned_geometry: records {sorted(overlap)} are in train and test")
    return train, test


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
            rows.append(key | {"step": step, "layer": layer, "head": head, "metric": prefix + name, "value": float(value)})
    return rows


def rows_to_tensors(rows: list[dict], step: int, shape_of: dict[str, tuple], prefix: str = "") -> dict[str, torch.Tensor]:
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
    unit: object  # relaylens.experiments.runner.UnitWork
    prefill_s: float
    answer_ids: torch.Tensor  # [A] (empty for records without a reference answer)


def record_loglik(model, item: Prepared, values: dict, factors, window_mode: str) -> torch.Tensor:
    """Mean per-token log-likelihood of the record's answer under the family at ``values`` (keeps the graph)."""
    from relaylens.generation.single import answer_log_probs

    coords = family_coordinates(item.unit.selection, values["b"], values["s"], values["alpha"], label="learned")
    return answer_log_probs(model, item.prefill, item.unit.selection, coords, item.prompt.question_ids, item.answer_ids,
                            factors, window_mode).mean()


def mean_loglik(model, items: list[Prepared], values: dict, factors, window_mode: str) -> float:
    with torch.no_grad():
        detached = {k: v.detach() for k, v in values.items()}
        return float(sum(float(record_loglik(model, item, detached, factors, window_mode)) for item in items) / len(items))


def evaluation_rows(model, train_items, test_items, values, factors, window_mode: str, key: dict, step: int) -> list[dict]:
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


def train(model, factors, train_items: list[Prepared], test_items: list[Prepared], options: LearnOptions, seed: int,
          key: dict, rows: list[dict], window_mode: str, commit, tick=None) -> dict[str, torch.Tensor]:
    """Run (or resume from ``rows``, the training unit's geometry rows) the Adam ascent; ``commit(rows)`` rewrites the
    training unit after every step; ``tick(step, text)`` reports progress. Returns the final family values."""
    from relaylens.generation.single import frozen_weights

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


def learned_file(out: Path, values: dict, options: LearnOptions, manifest: dict, spec, train_ids, test_ids,
                 seed: int, num_layers: int, num_kv_heads: int) -> Path:
    """Write ``RUN_DIR/learned_geometry.json`` (atomically): what ``learned:RUN_DIR`` reads."""
    from relaylens.results.atomic import write_atomic

    doc = {"format": 1, "analysis": "learned_geometry", "sharing": options.sharing,
           "parameters": {name: values[name].detach().tolist() for name in PARAMETERS},
           "num_layers": num_layers, "num_kv_heads": num_kv_heads, "model": manifest.get("model"),
           "selector": spec.selectors[0], "budget": float(spec.budgets[0]), "prompt_mode": spec.prompt_mode,
           "options": asdict(options), "seed": seed, "train_records": list(train_ids), "test_records": list(test_ids)}
    return write_atomic(out / LEARNED_FILE, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def check_learned_conditions(spec, manifest: dict, record_ids: list[str]) -> None:
    """Refuse ``learned:RUN_DIR`` conditions learned on another model, selector or budget, or on these records."""
    from relaylens.conditions.scoped import Scoped, get_condition

    for spec_condition in spec.conditions:
        condition = get_condition(spec_condition)
        parts = [condition.inner, condition.base] if isinstance(condition, Scoped) else [condition]
        for part in (p for p in parts if isinstance(p, Learned)):
            info, label = part.info, part.label
            learned_model, this_model = info.get("model") or {}, manifest.get("model") or {}
            for field_name in ("weights_hash", "config_sha256"):
                if learned_model.get(field_name) and this_model.get(field_name) \
                        and learned_model[field_name] != this_model[field_name]:
                    raise RelaylensError(f"condition {label} was learned on model {learned_model.get('spec')} "
                                         f"({field_name} {str(learned_model[field_name])[:12]}); this run uses "
                                         f"{this_model.get('spec')} ({str(this_model[field_name])[:12]}). Fix: learn a "
                                         "geometry for this model (relaylens run learned_geometry --model ...)")
            swept = {(s, float(b)) for s in spec.selectors for b in spec.budgets}
            learned = (info.get("selector"), float(info.get("budget", float("nan"))))
            if swept != {learned}:
                raise RelaylensError(f"condition {label} was learned on {learned[0]} @ {learned[1]:g}; this run sweeps "
                                     f"{', '.join(f'{s} @ {b:g}' for s, b in sorted(swept))}. Fix: run it with "
                                     f"--selector {learned[0]} --budget {learned[1]:g} only, or learn a geometry for "
                                     "that selector and budget")
            overlap = sorted(set(info.get("train_records") or ()) & set(record_ids))
            if overlap:
                raise RelaylensError(f"condition {label} was trained on {len(overlap)} of this run's records (e.g. "
                                     f"{overlap[0]}): a train/test overlap. Fix: evaluate it on other records (its "
                                     f"test split: {len(info.get('test_records') or ())} records), or use other data")
