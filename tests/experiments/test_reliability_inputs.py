"""Reliability: every bad input gets a clear relaylens error naming the input and the fix, raised by relaylens code
(never a bare error from deep inside torch / transformers), and no partial result is left behind.

Cases run in process on the tiny random Llama and tokenizer (``relaylens.testing``); CLI cases run the typer app in
process (``CliRunner``), except the unwritable ``--out`` case, which starts the real CLI once.
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relaylens.errors import RelaylensError

# OSError: StoreWriteError, FileNotFoundError (the CLI maps all to exit 2)
ERRORS = (RelaylensError, ValueError, OSError)


# ---------------------------------------------------------------------------------------------------- fixtures


@dataclasses.dataclass
class Env:
    root: Path
    model: object
    tokenizer: object
    model_dir: Path
    records: list  # LongMemEval dicts
    data: Path  # the records as a file
    record: object  # the first record, parsed
    prompt: object
    prefill: object
    factors: object
    selection: object


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from relaylens.datasets import load_records
    from relaylens.datasets.prompting import render_prompt
    from relaylens.datasets.synthetic import generate_records
    from relaylens.geometry.rotary import RotaryFactors
    from relaylens.model.prefill import prefill_history
    from relaylens.selectors import make_selector
    from relaylens.testing import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("reliability")
    model, tokenizer = tiny_model("llama", seed=0), tiny_tokenizer()
    model_dir = root / "tiny-llama"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    records = generate_records(n=2, seed=3, history_tokens=800)
    data = root / "records.json"
    data.write_text(json.dumps(records))
    record = load_records(data)[0]
    prompt = render_prompt(record, tokenizer, mode="completion")
    prefill = prefill_history(model, prompt.history_ids, window_size=32)
    selection = make_selector("snapkv").select(prefill, prompt, 0.4)
    return Env(root, model, tokenizer, model_dir, records, data, record, prompt, prefill,
               RotaryFactors.from_model(model), selection)


def _write(env: Env, name: str, text: str) -> Path:
    path = env.root / name
    path.write_text(text)
    return path


def _record(env: Env, **changes) -> dict:
    rec = copy.deepcopy(env.records[0])
    rec.update(changes)
    return rec


def _load_path(path: Path, fmt: str = "auto"):
    from relaylens.datasets import load_records

    return load_records(path, format=fmt)


def _load_text(env: Env, name: str, text: str, fmt: str = "auto"):
    return _load_path(_write(env, name, text), fmt)


def _load(env: Env, name: str, objects, fmt: str = "auto"):
    return _load_text(env, name, json.dumps(objects), fmt)


def _assert_no_results(out: Path) -> None:
    """No committed unit, no table, no temp file: a failed run leaves nothing a reader could take for a result."""
    if not out.exists():
        return
    left = [p for p in out.rglob("*") if p.is_file() and p.name not in ("manifest.json",)]
    assert not left, f"partial results left behind in {out}: {left}"


def _run(env: Env, out: Path, spec=None, model_and_tokenizer=None, **config):
    from relaylens.experiments.runner import RunConfig, run_analysis
    from relaylens.experiments.specs import load_analysis

    spec = spec or load_analysis("ordering").spec.replace(budgets=(0.4,), max_new_tokens=2)
    config = RunConfig(model=str(env.model_dir), data=str(config.pop("data", env.data)), out=str(out), **config)
    return run_analysis(spec, config, progress=False,
                        model_and_tokenizer=model_and_tokenizer or (env.model, env.tokenizer))


# ------------------------------------------------------------------------------------------ in-process cases
# Each case: (id, fn(env, tmp_path) that must raise, message fragments). Fragments name the input and the fix.

def _keys(n=5, dtype=torch.float32):
    return torch.randn(2, n, 16, dtype=dtype)


def _relocate(env, keys, src, dst, **kw):
    from relaylens.geometry.rotary import relocate_keys

    return relocate_keys(keys, src, dst, env.factors, **kw)


def _relocate_with(factors, keys, src, dst):
    from relaylens.geometry.rotary import relocate_keys

    return relocate_keys(keys, src, dst, factors)


def _tiny(variant, **overrides):
    from relaylens.testing import tiny_model

    return tiny_model(variant, **overrides)


def _nan_keys(value):
    keys = _keys()
    keys[1, 3, 5] = value
    return keys


def _factors_of(variant, **overrides):
    from relaylens.geometry.rotary import RotaryFactors
    from relaylens.testing import tiny_model

    return RotaryFactors.from_model(tiny_model(variant, **overrides))


def _weird_rope(env):
    from relaylens.geometry.rotary import RotaryFactors
    from relaylens.testing import tiny_model

    model = tiny_model("llama")
    model.model.rotary_emb.rope_type = "ntk_by_parts"
    return RotaryFactors.from_model(model)


def _selection(positions, history_length=10):
    from relaylens.geometry.selection import Selection

    pos = torch.tensor([[positions]])
    return Selection(pos, torch.ones_like(pos, dtype=torch.bool), history_length)


def _poisoned_prefill(env, what, layer, value):
    pre = copy.copy(env.prefill)
    tensors = [t.clone() for t in getattr(pre, what)]
    tensors[layer][0, int(env.selection.positions[layer, 0, 1])] = value
    setattr(pre, what, tensors)
    return pre


def _build(env, prefill, condition="relay"):
    from relaylens.generation.single import build_cache

    return build_cache(prefill, env.selection, condition, env.factors)


def _select(env, budget, selector="snapkv"):
    from relaylens.selectors import make_selector

    return make_selector(selector).select(env.prefill, env.prompt, budget)


def _prefill(model, ids, **kw):
    from relaylens.model.prefill import prefill_history

    return prefill_history(model, ids, **kw)


def _render(env, record=None, **kw):
    from relaylens.datasets.prompting import render_prompt

    return render_prompt(record or env.record, kw.pop("tokenizer", env.tokenizer), **kw)


def _no_template_tokenizer(env):
    tok = copy.deepcopy(env.tokenizer)
    tok.chat_template = None
    return tok


def _spec(**kw):
    from relaylens.experiments.specs import ExperimentSpec

    base = dict(name="bad", selectors=("snapkv",), budgets=(0.1,), conditions=("original", "relay"))
    return ExperimentSpec(**{**base, **kw})


def _condition(spec):
    from relaylens.conditions.scoped import get_condition

    return get_condition(spec)


def _make_selector(name, **kw):
    from relaylens.selectors import make_selector

    return make_selector(name, **kw)


FIXTURES = Path(__file__).parents[1] / "fixtures"


def _personamem(env, name, edit_row=None, edit_context=None):
    """A copy of the PersonaMem fixture (questions CSV + shared contexts) with one row / the contexts edited."""
    import pandas as pd

    folder = env.root / f"pm-{name}"
    folder.mkdir(exist_ok=True)
    frame = pd.read_csv(FIXTURES / "questions_32k.csv", dtype=str, keep_default_na=False)
    if edit_row:
        edit_row(frame)
    frame.to_csv(folder / "questions_32k.csv", index=False)
    lines = (FIXTURES / "shared_contexts_32k.jsonl").read_text().splitlines()
    if edit_context:
        lines = [edit_context(line) for line in lines]
    (folder / "shared_contexts_32k.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "questions_32k.csv"


def _load_personamem(env, name, lenient=False, **edits):
    from relaylens.datasets import load_records

    return load_records(_personamem(env, name, **edits), lenient=lenient)


def _set(column, value, row=0):
    def edit(frame):
        frame.loc[row, column] = value
    return edit


def _context_as_object(line):
    ((cid, messages),) = json.loads(line).items()
    return json.dumps({cid: {"messages": messages}})


def _infinitebench(env, name, edit):
    objects = [json.loads(line) for line in (FIXTURES / "longbook_choice_eng.jsonl").read_text().splitlines()]
    edit(objects)
    return _load_text(env, f"{name}_longbook_choice_eng.jsonl", "\n".join(json.dumps(o) for o in objects) + "\n")


def _many_options(objects):
    objects[0]["options"] = [f"option {k}" for k in range(27)]
    objects[0]["answer"] = ["option 26"]


def _same_int_and_str_id(objects):
    objects[1]["id"] = str(objects[0]["id"])


def _nested(depth):
    return "[" * depth + "]" * depth


def _surrogate_question(env):
    """JSON's escape ``\\ud800`` (half of a surrogate pair, alone) decodes to a str no encoder accepts."""
    return _load_text(env, "surrogate.json", json.dumps([_record(env, question="What is \ud800 my dog called?")]))


def _latin1(env):
    path = env.root / "latin1.json"
    path.write_bytes(json.dumps([_record(env, question="Où est mon chien?")], ensure_ascii=False).encode("latin-1"))
    return _load_path(path)


def _original_past_context(env):
    """History and question fit a 64-position model, the answer tokens do not: the `original` condition."""
    from relaylens.generation.single import run_condition
    from relaylens.geometry.selection import Selection

    model = _tiny("llama", max_position_embeddings=64)
    prefill = _prefill(model, torch.arange(3, 53), window_size=8)
    full = Selection.full(prefill.history_length, prefill.num_layers, prefill.num_kv_heads)
    return run_condition(model, prefill, full, "original", torch.arange(3, 11), max_new_tokens=20)


IN_PROCESS = [
    # --- dataset readers
    ("reader-truncated-json", lambda e, t: _load_text(e, "trunc.json", json.dumps(e.records)[:400]),
        ["trunc.json", "not valid JSON", "Fix"]),
    ("reader-jsonl-bad-line", lambda e, t: _load_text(
        e, "bad.jsonl", json.dumps(e.records[0]) + "\n{\"question_id\": \n", fmt="longmemeval"),
        ["bad.jsonl", "line 2", "not valid JSON", "Fix"]),
    ("reader-broken-json-of-unknown-shape", lambda e, t: _load_text(e, "broken.json", '[{"question_id": "q1", '),
        ["broken.json", "not valid JSON", "Fix"]),
    ("reader-empty-file", lambda e, t: _load_text(e, "empty.json", ""), ["empty.json", "is empty", "Fix"]),
    ("reader-question-id-int", lambda e, t: _load(e, "qid.json", [_record(e, question_id=17)]),
        ["qid.json", "'question_id'", "expected a str", "got 17", "Fix"]),
    ("reader-answer-list", lambda e, t: _load(e, "ans.json", [_record(e, answer=["a", "b"])]),
        ["'answer'", "string or a bare JSON number"]),
    ("reader-has-answer-string", lambda e, t: _load(e, "has.json", [_record(e, haystack_sessions=[
        [{"role": "user", "content": "hi", "has_answer": "yes"}]] + e.records[0]["haystack_sessions"][1:])]),
        ["has_answer", "'yes'", "JSON bool"]),
    ("reader-bad-date", lambda e, t: _load(e, "date.json", [_record(e, question_date="30 May 2023")]),
        ["question_date", "'30 May 2023'", "LongMemEval's format"]),
    ("reader-evidence-id-matches-nothing", lambda e, t: _load(e, "ev.json", [_record(e, answer_session_ids=["nope"])]),
        ["answer_session_ids[0]", "'nope'", "haystack_session_ids", "Fix"]),
    ("reader-unaligned-haystack", lambda e, t: _load(e, "align.json", [_record(
        e, haystack_dates=e.records[0]["haystack_dates"][:-1])]), ["haystack_sessions", "equal length", "Fix"]),
    ("reader-unknown-role", lambda e, t: _load(e, "role.json", [_record(e, haystack_sessions=[
        [{"role": "system", "content": "hi"}]] + e.records[0]["haystack_sessions"][1:])]),
        ["role", "'system'", "'user' or 'assistant'"]),
    ("reader-record-not-object", lambda e, t: _load(e, "list.json", [[1, 2, 3]], fmt="longmemeval"),
        ["list.json", "a JSON object"]),
    ("reader-unknown-format", lambda e, t: _load(e, "fmt.json", e.records, fmt="csvx"),
        ["unknown dataset format", "'csvx'", "longmemeval"]),
    ("reader-missing-file", lambda e, t: _load_path(t / "absent.json"),
        ["absent.json", "does not exist"]),
    # --- dataset readers: issue 14 (silently wrong results, tracebacks)
    ("reader-duplicate-record-id", lambda e, t: _load(e, "dup.json", [e.records[0], e.records[1] | {
        "question_id": e.records[0]["question_id"]}]), ["dup.json", "item 1", "already used by", "item 0", "Fix"]),
    ("reader-infinitebench-int-and-str-id", lambda e, t: _infinitebench(e, "dupid", _same_int_and_str_id),
        ["already used by", "line 1", "line 2", "unique"]),
    ("reader-duplicate-haystack-session-id", lambda e, t: _load(e, "dupsess.json", [_record(
        e, haystack_session_ids=[e.records[0]["haystack_session_ids"][0]]
        * len(e.records[0]["haystack_session_ids"]))]),
        ["haystack_session_ids[1]", "also haystack_session_ids[0]", "Fix"]),
    ("reader-empty-reference", lambda e, t: _load(e, "emptyref.json", [_record(e, answer="")]),
        ["reference answer ''", "empty after answer normalisation", "Fix"]),
    ("reader-article-only-reference", lambda e, t: _load(e, "theref.json", [_record(e, answer="The")]),
        ["reference answer 'The'", "exact match 1"]),
    ("reader-letter-a-reference", lambda e, t: _load(e, "aref.json", [_record(e, answer="A")]),
        ["reference answer 'A'", "empty after"]),
    ("reader-nan-answer", lambda e, t: _load_text(e, "nan.json", json.dumps([_record(e, answer=float("nan"))])),
        ["nan.json", "'answer'", "finite number", "nan", "Fix"]),
    ("reader-inf-answer", lambda e, t: _load_text(e, "inf.json", json.dumps([_record(e, answer=float("inf"))])),
        ["inf.json", "'answer'", "finite number", "inf"]),
    ("reader-personamem-fractional-end-index", lambda e, t: _load_personamem(
        e, "frac", edit_row=_set("end_index_in_shared_context", "2.9")),
        ["end_index_in_shared_context", "whole number", "'2.9'", "Fix"]),
    ("reader-personamem-inf-end-index", lambda e, t: _load_personamem(
        e, "inf", edit_row=_set("end_index_in_shared_context", "inf")), ["end_index_in_shared_context", "'inf'"]),
    ("reader-personamem-context-not-a-list", lambda e,
     t: _load_personamem(e, "ctxobj", edit_context=_context_as_object),
        ["shared_contexts_32k.jsonl", "a list of messages", "Fix"]),
    ("reader-personamem-five-options", lambda e, t: _load_personamem(e, "five", edit_row=_set(
        "all_options", "['(a) x', '(b) y', '(c) z', '(d) w', '(e) v']")),
     ["all_options", "at most 4 options", "5 options"]),
    ("reader-infinitebench-27-options", lambda e, t: _infinitebench(e, "many", _many_options),
        ["'options'", "at most 4 options", "27 options", "A-D"]),
    ("reader-deeply-nested-json", lambda e, t: _load_text(e, "deep.json", _nested(100_000)),
        ["deep.json", "nested too deeply", "Fix"]),
    ("reader-deeply-nested-jsonl-line", lambda e, t: _load_text(
        e, "deep.jsonl", json.dumps(e.records[0]) + "\n" + _nested(100_000) + "\n", fmt="longmemeval"),
        ["deep.jsonl", "nested too deeply"]),
    ("reader-lone-surrogate", lambda e, t: _surrogate_question(e),
     ["surrogate.json", "'question'", "unpaired surrogate", "Fix"]),
    ("reader-latin1-file", lambda e, t: _latin1(e), ["latin1.json", "not UTF-8", "re-encode", "Fix"]),
    # --- prompt rendering
    ("prompt-empty-history", lambda e, t: _render(e, dataclasses.replace(e.record, sessions=()), mode="completion"),
        ["empty history", "0 sessions", "Fix"]),
    ("prompt-sessions-without-turns", lambda e, t: _render(e, dataclasses.replace(
        e.record, sessions=tuple(dataclasses.replace(s, turns=()) for s in e.record.sessions)), mode="chat"),
        ["empty history", "at least one session"]),
    ("prompt-unknown-mode", lambda e, t: _render(e, mode="poem"), ["mode", "'poem'", "chat", "completion"]),
    ("prompt-no-chat-template", lambda e, t: _render(e, mode="chat", tokenizer=_no_template_tokenizer(e)),
        ["no chat template", "mode='completion'"]),
    ("prompt-history-format", lambda e, t: _render(e, mode="completion", history_format="xml"),
        ["history_format", "'xml'", "nl"]),
    # --- prefill
    ("prefill-history-beyond-context", lambda e, t: _prefill(
        _tiny("llama", max_position_embeddings=64), torch.arange(3, 200)),
        ["197 tokens", "max_position_embeddings=64", "Fix"]),
    ("prefill-empty-history", lambda e, t: _prefill(e.model, torch.zeros(0, dtype=torch.long)), ["empty"]),
    ("prefill-float-token-ids", lambda e, t: _prefill(e.model, torch.rand(40)), ["integer token ids", "float32"]),
    ("prefill-ids-outside-vocabulary", lambda e, t: _prefill(e.model, torch.arange(1000, 1040)),
        ["1000..1039", "vocabulary 0..383", "tokenizer", "Fix"]),
    ("generation-original-past-context", lambda e, t: _original_past_context(e),
        ["condition original", "max_position_embeddings=64", "no shift to reduce", "Fix"]),
    ("prefill-window-longer-than-history", lambda e, t: _prefill(e.model, torch.arange(3, 10), window_size=32),
        ["shorter than window_size=32", "Fix"]),
    # --- geometry
    ("geometry-nan-keys", lambda e, t: _relocate(e, _nan_keys(float("nan")), torch.arange(5), torch.arange(5) + 3),
        ["NaN or inf", "flattened slot 8", "Fix"]),
    ("geometry-inf-keys-identity-move", lambda e,
     t: _relocate(e, _nan_keys(float("inf")), torch.arange(5), torch.arange(5)),
        ["NaN or inf", "Fix"]),
    ("geometry-float16-overflow", lambda e, t: _relocate(e, torch.full((1, 1, 16), 60000.0, dtype=torch.float16),
        torch.tensor([0]), torch.tensor([7])), ["overflow", "float16", "Fix", "float32 or bfloat16"]),
    ("geometry-negative-position", lambda e, t: _relocate(e, _keys(), torch.tensor([0, 1, 2, 3, -4]), torch.arange(5)),
        ["source positions", "negative position (-4)"]),
    ("geometry-position-past-rotary", lambda e, t: _relocate(e, _keys(), torch.arange(5), torch.arange(5) + 131070),
        ["target positions", "131074", "max_position_embeddings=131072"]),
    # floating-point positions are real-valued positions (tests/geometry/test_real.py): refused when not
    # finite; other non-integer dtypes are refused as before
    ("geometry-bool-positions", lambda e, t: _relocate(e, _keys(), torch.ones(5, dtype=torch.bool), torch.arange(5)),
        ["integer positions", "torch.bool"]),
    ("geometry-nan-float-positions", lambda e,
     t: _relocate(e, _keys(), torch.tensor([0.0, 1.0, float("nan"), 3.0, 4.0]),
                                                             torch.arange(5)),
     ["source positions", "NaN or inf", "Fix"]),
    ("geometry-head-dim-mismatch", lambda e, t: _relocate(e, torch.randn(2, 5, 8), torch.arange(5), torch.arange(5)),
        ["head_dim 8", "16"]),
    ("geometry-positions-do-not-broadcast", lambda e, t: _relocate(e, _keys(), torch.arange(4), torch.arange(4)),
        ["do not broadcast", "one position per slot"]),
    ("geometry-dynamic-rope", lambda e, t: _factors_of("llama", rope_parameters={
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}), ["'dynamic'", "refuses", "default"]),
    ("geometry-longrope", lambda e, t: _factors_of("llama", rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
        "original_max_position_embeddings": 4096}), ["'longrope'", "refuses"]),
    ("geometry-unsupported-rope-type", lambda e, t: _weird_rope(e),
     ["unsupported rope type", "'ntk_by_parts'", "yarn"]),
    ("geometry-per-layer-rope-needs-layer", lambda e, t: _relocate_with(
        _factors_of("gemma3"), torch.randn(1, 3, 16), torch.arange(3), torch.arange(3) + 1), ["layer=<index>"]),
    # --- selections (kept positions)
    ("selection-unsorted-positions", lambda e, t: _selection([3, 1, 7]), ["strictly ascending", "[3, 1, 7]"]),
    ("selection-duplicate-positions", lambda e, t: _selection([1, 1, 4]), ["no duplicates", "[1, 1, 4]"]),
    ("selection-position-past-history", lambda e, t: _selection([2, 12]), ["history_length (10)", "[2, 12]"]),
    # --- conditions and the cache they build
    ("condition-unknown-name", lambda e, t: _condition("relax"),
     ["unknown condition 'relax'", "relay", "query_only(2048)"]),
    ("condition-alpha-out-of-range", lambda e, t: _condition("compaction(1.5)"), ["alpha", "[0, 1]", "1.5"]),
    ("condition-parameter-on-plain", lambda e, t: _condition("relay(3)"), ["'relay' takes no parameter"]),
    ("condition-wrong-keyword", lambda e, t: _condition("query_only(seed=3)"), ["takes shift=", "seed="]),
    ("cache-nan-values", lambda e, t: _build(e, _poisoned_prefill(e, "values", 0, float("nan"))),
        ["layer 0", "values", "NaN or inf", "Fix"]),
    ("cache-inf-keys", lambda e, t: _build(e, _poisoned_prefill(e, "keys", 1, float("-inf")), "original"),
        ["layer 1", "keys", "NaN or inf", "Fix"]),
    # --- selectors and budgets
    ("selector-unknown-name", lambda e, t: _make_selector("snapkvv"), ["unknown selector 'snapkvv'", "snapkv"]),
    ("selector-unknown-hyperparameter", lambda e, t: _make_selector("snapkv", windw=8), ["'windw'", "window"]),
    ("selector-even-kernel", lambda e, t: _make_selector("snapkv", kernel_size=4), ["kernel_size", "odd", "4"]),
    ("budget-zero-ratio", lambda e, t: _select(e, 0.0), ["(0, 1]", "0.0"]),
    ("budget-zero-states", lambda e, t: _select(e, 0), ["positive int", "0"]),
    ("budget-ratio-above-one", lambda e, t: _select(e, 1.5), ["(0, 1]", "1.5", "Budget(states=N)"]),
    ("budget-nan", lambda e, t: _select(e, float("nan")), ["budget ratio", "nan"]),
    ("budget-unreadable-text", lambda e, t: _select(e, "ten percent"), ["'ten percent'", "'B2048'"]),
    ("budget-below-observation-window", lambda e, t: _select(e, 8), ["K=8", "window w=32", "raise the budget"]),
    # --- experiment specs (runner configuration)
    ("spec-unknown-selector", lambda e, t: _spec(selectors=("h2o", "nope")), ["unknown selector 'nope'"]),
    ("spec-unknown-condition", lambda e, t: _spec(conditions=("original", "bogus")), ["unknown condition 'bogus'"]),
    ("spec-without-original", lambda e, t: _spec(conditions=("relay",)), ["must include 'original'"]),
    ("spec-budget-zero", lambda e, t: _spec(budgets=(0,)), ["budget 0", "(0, 1]"]),
    ("spec-budget-fraction-above-one", lambda e, t: _spec(budgets=(2.5,)), ["budget 2.5", "whole number of states"]),
    ("spec-negative-max-new-tokens", lambda e, t: _spec(max_new_tokens=-1), ["max_new_tokens", "-1"]),
]


@pytest.mark.parametrize(("fn", "fragments"), [pytest.param(fn, frags, id=name) for name, fn, frags in IN_PROCESS])
def test_bad_input_raises_a_clear_relaylens_error(env, tmp_path, fn, fragments):
    with pytest.raises(ERRORS) as info:
        fn(env, tmp_path)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"
    raised_in = Path(info.traceback[-1].path)
    assert "relaylens" in raised_in.parts, (f"raised from {raised_in} (deep inside a library), not by relaylens: "
                                            f"{message}")


def test_relocation_error_leaves_input_untouched(env):
    keys = _nan_keys(float("nan"))
    before = keys.clone()
    with pytest.raises(RelaylensError):
        _relocate(env, keys, torch.arange(5), torch.arange(5) + 9)
    assert torch.equal(keys.isnan(), before.isnan()) and torch.equal(keys.nan_to_num(), before.nan_to_num())


def test_whole_number_budget_is_a_state_count_not_a_ratio(env, tmp_path):
    """``--budget 64`` reaches the spec as 64.0: it must select 64 states, not fail mid-run as 'ratio 64.0'."""
    spec = _spec(budgets=(64.0, 0.25))
    assert spec.budgets == (64, 0.25) and isinstance(spec.budgets[0], int)
    selection = _select(env, spec.budgets[0])
    assert int(selection.counts.max()) == 64


# ------------------------------------------------------------------------------------------ runner configuration

def _bad_record_file(env):
    return _write(env, "empty-history.json", json.dumps([_record(
        env, haystack_session_ids=[], haystack_dates=[], haystack_sessions=[], answer_session_ids=[])]))


RUN_CASES = [
    ("run-negative-limit", dict(limit=-1), ["limit", "-1", "Fix"]),
    ("run-zero-limit", dict(limit=0), ["limit", "got 0"]),
    ("run-unknown-window-mode", dict(window_mode="sliding"), ["window_mode", "'sliding'", "condition"]),
    ("run-zero-window", dict(window_size=0), ["window_size", "0"]),
    ("run-zero-chunk", dict(chunk_size=0), ["chunk_size", "0"]),
    ("run-missing-data", dict(data="/nonexistent/records.json"), ["/nonexistent/records.json", "does not exist"]),
    ("run-unknown-format", dict(data_format="xlsx"), ["unknown dataset format 'xlsx'"]),
    ("run-bad-shard", dict(shard="2/2"), ["--shard 2/2", "0 <= i < n"]),
    ("run-empty-history-record", dict(data="@empty-history"), ["empty history", "Fix"]),
    ("run-zero-records", dict(data="@zero"), ["holds no records"]),
    ("run-out-under-a-file", dict(out="@under-file"), ["cannot create run directory", "Fix", "--out"]),
]


@pytest.mark.parametrize(("config", "fragments"), [pytest.param(c, f, id=n) for n, c, f in RUN_CASES])
def test_bad_run_configuration_fails_before_any_result(env, tmp_path, config, fragments):
    from relaylens.testing import tiny_model

    config = dict(config)
    out = tmp_path / "run"
    if config.get("data") == "@empty-history":
        config["data"] = _bad_record_file(env)
    if config.get("data") == "@zero":
        config["data"], config["data_format"] = _write(env, "zero.json", "[]"), "longmemeval"
    model_and_tokenizer = None
    if config.pop("model", None) == "@short-context":
        model_and_tokenizer = (tiny_model("llama", max_position_embeddings=64), env.tokenizer)
    if config.pop("out", None) == "@under-file":
        (tmp_path / "a-file").write_text("not a directory")
        out = tmp_path / "a-file" / "run"
    with pytest.raises(ERRORS) as info:
        _run(env, out, model_and_tokenizer=model_and_tokenizer, **config)
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} missing from: {info.value}"
    _assert_no_results(out)


def test_history_beyond_context_is_skipped_and_recorded(env, tmp_path):
    """A record whose history passes the model's rotary range: skipped (issue 15), named, never a crash."""
    from relaylens.results.store import load_tables
    from relaylens.testing import tiny_model

    out = _run(env, tmp_path / "run", limit=1,
               model_and_tokenizer=(tiny_model("llama", max_position_embeddings=64), env.tokenizer))
    skipped = load_tables(out)["skipped"]
    assert set(skipped.reason) == {"too_long"} and "max_position_embeddings=64" in skipped.detail.iloc[0]
    assert len(load_tables(out)["answers"]) == 0


# ------------------------------------------------------------------------------------------------ full disk

def _enospc_after_half(f, data):
    """A writer whose disk fills half way through the file."""
    f.write(data[: len(data) // 2])
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_failing_writer_leaves_no_partial_unit(tmp_path):
    from relaylens.results.store import RunStore, StoreWriteError, UnitKey

    store = RunStore.create_or_open(tmp_path / "run", {"analysis": "demo", "config": {}})
    store.writer = _enospc_after_half
    with pytest.raises(StoreWriteError) as info:
        store.write_unit(UnitKey("q1", "snapkv", 0.1), [], [], [])
    assert "disk is full" in str(info.value) and "nothing partial was kept" in str(info.value)
    assert info.value.errno == errno.ENOSPC
    _assert_no_results(tmp_path / "run")


def test_full_disk_mid_run_leaves_no_partial_result(env, tmp_path, monkeypatch):
    """The whole runner on a disk that fills at the first unit: a clear error, no unit, no table, no temp file."""
    from relaylens.results.store import RunStore, StoreWriteError

    create_or_open = RunStore.create_or_open.__func__

    def full_disk_store(cls, run_dir, manifest, force=False, writer=None):
        store = create_or_open(cls, run_dir, manifest, force=force)
        store.writer = _enospc_after_half  # the manifest fit; the first unit does not
        return store

    monkeypatch.setattr(RunStore, "create_or_open", classmethod(full_disk_store))
    out = tmp_path / "run"
    with pytest.raises(StoreWriteError) as info:
        _run(env, out, limit=1)
    assert "disk is full" in str(info.value) and "--out" in str(info.value)
    _assert_no_results(out)


def test_tiny_filesystem_fills_with_a_clear_error(tmp_path):
    """A real 48 KiB tmpfs (needs mount privileges, else skipped): the unit that does not fit is not kept."""
    from relaylens.results.store import RunStore, StoreWriteError, UnitKey

    mount = tmp_path / "tiny"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)]
    if not shutil.which("mount") or subprocess.run(command, capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (no privileges)")
    try:
        store = RunStore.create_or_open(mount / "run", {"analysis": "demo", "config": {}})
        rows = [dict(record_id="q1", selector="s", budget=0.1, condition="relay", probe_point="question_final",
                     source="forward", layer=i, head=0, metric=os.urandom(16).hex(), value=float(i))
                for i in range(4000)]  # random metric names: incompressible, far more than 48 KiB
        with pytest.raises(StoreWriteError) as info:
            store.write_unit(UnitKey("q1", "s", 0.1), [], [], rows)
        assert "disk is full" in str(info.value)
        _assert_no_results(mount / "run")
    finally:
        subprocess.run(["umount", str(mount)], check=False)


# ---------------------------------------------------------------------------------------------------- CLI

CLI_CASES = [
    ("cli-budget-zero", ["--budget", "0"], ["budget 0.0", "(0, 1]"]),
    ("cli-budget-negative", ["--budget", "-0.5"], ["budget -0.5"]),
    ("cli-budget-nan", ["--budget", "nan"], ["budget nan"]),
    ("cli-unknown-analysis", ["@analysis", "no_such_analysis"], ["unknown analysis 'no_such_analysis'", "ordering"]),
    ("cli-malformed-json", ["--data", "@truncated"], ["not valid JSON", "Fix"]),
    ("cli-empty-data-file", ["--data", "@empty"], ["is empty", "Fix"]),
    ("cli-negative-limit", ["--limit", "-3"], ["limit", "-3", "Fix"]),
    ("cli-shard-garbage", ["--shard", "a/b"], ["--shard", "'a/b'"]),
    ("cli-prompt-mode", ["--prompt-mode", "poem"], ["prompt_mode", "'poem'"]),
    ("cli-model-missing", ["--model", "/nonexistent/model"], ["/nonexistent/model", "does not exist"]),
    ("cli-out-under-a-file", ["--out", "@under-file"], ["cannot create run directory", "--out"]),
    ("cli-merge-not-a-run", ["@merge"], ["not a run directory", "Fix"]),
    # issue 14: analysis names that are paths, bad counts, foreign run folders, OS errors with fitting fixes
    ("cli-analysis-name-dot", ["@analysis", "."], ["analysis name '.'", "not a plain name", "ordering"]),
    ("cli-analysis-name-dotdot", ["@analysis", ".."], ["analysis name '..'", "not a plain name"]),
    ("cli-analysis-name-path", ["@analysis", "../x"], ["analysis name '../x'", "not a plain name"]),
    ("cli-synth-negative-n", ["@argv", "data", "synth", "--n", "-1", "--out", "{tmp}/synth.json"],
     ["--n", "-1", "Fix"]),
    ("cli-bench-zero-repeats", ["@argv", "bench", "geometry", "--repeats", "0", "--out", "{tmp}/bench"],
        ["--repeats", "at least 1", "got 0"]),
    ("cli-bench-bad-schedule", ["@argv", "bench", "overhead", "--schedule", "random", "--out", "{tmp}/bench"],
        ["--schedule", "interleaved or back-to-back", "'random'"]),
    ("cli-bench-negative-chunk", ["@argv", "bench", "overhead", "--prefill-chunk", "-1", "--out", "{tmp}/bench"],
        ["--prefill-chunk", ">= 0", "got -1"]),
    ("cli-figures-empty-format", ["@argv", "figures", "{foreign}", "--format", ""],
     ["--format ''", "no figure format", "png"]),
    ("cli-report-foreign-manifest", ["@argv", "report", "{foreign}"],
     ["manifest.json", "not a relaylens run manifest", "Fix"]),
    ("cli-report-manifest-not-object", ["@argv", "report", "{list-manifest}"], ["not a relaylens run manifest"]),
    ("cli-hub-id-offline", ["--model", "relaylens-test/no-such-model"],
     ["cannot load model 'relaylens-test/no-such-model'",
        "hub", "Fix", "network"]),
]

#: Advice an error line must not give: a full-disk hint for a failure that has nothing to do with disk space.
NOT_IN_CLI_ERRORS = ["free space", "replace=True", "Traceback"]


@pytest.mark.parametrize(("args", "fragments"), [pytest.param(a, f, id=n) for n, a, f in CLI_CASES])
def test_bad_cli_arguments_exit_2_with_one_clear_line(env, tmp_path, args, fragments):
    from typer.testing import CliRunner

    from relaylens.cli import app

    out = tmp_path / "out"
    analysis = "ordering"
    args = list(args)
    if args[0] == "@analysis":
        analysis, args = args[1], []
    if "@truncated" in args:
        args[args.index("@truncated")] = str(_write(env, "cli-trunc.json", json.dumps(env.records)[:300]))
    if "@empty" in args:
        args[args.index("@empty")] = str(_write(env, "cli-empty.json", ""))
    if "@under-file" in args:
        (tmp_path / "a-file").write_text("x")
        out = tmp_path / "a-file" / "run"
        args[args.index("@under-file")] = str(out)
    if args[:1] == ["@merge"]:
        command = ["merge", str(tmp_path / "not-a-run"), "--out", str(out)]
    elif args[:1] == ["@argv"]:
        foreign = tmp_path / "foreign"
        foreign.mkdir()
        (foreign / "manifest.json").write_text(json.dumps({"name": "someone else's project", "version": 3}))
        listed = tmp_path / "listed"
        listed.mkdir()
        (listed / "manifest.json").write_text("[1, 2]")
        places = {"{tmp}": str(tmp_path), "{foreign}": str(foreign), "{list-manifest}": str(listed)}
        command = [next((a.replace(k, v) for k, v in places.items() if k in a), a) for a in args[1:]]
    else:
        command = ["run", analysis, "--model", str(env.model_dir), "--data", str(env.data), "--limit", "1",
                   "--max-new-tokens", "2", "--out", str(out), *args]
    # a narrow terminal must not wrap the line; the hub is unreachable (offline) for the hub-id case
    result = CliRunner().invoke(app, command, env={"COLUMNS": "80", "HF_HUB_OFFLINE": "1"})
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], f"{fragment!r} missing from: {errors[0]}"
    for wrong in NOT_IN_CLI_ERRORS:
        assert wrong not in result.stderr, f"{wrong!r} in: {result.stderr}"
    _assert_no_results(out)


def test_real_cli_unwritable_out_under_proc(env):
    """The real entry point: ``--out`` inside /proc (not writable even by root) exits 2 with one line, no traceback."""
    out = "/proc/relaylens-reliability/run"
    result = subprocess.run([sys.executable, "-m", "relaylens.cli", "run", "ordering", "--model", str(env.model_dir),
                             "--data", str(env.data), "--limit", "1", "--max-new-tokens", "2", "--out", out],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "COLUMNS": "80", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "cannot create run directory /proc/relaylens-reliability/run" in errors[0], result.stderr
    assert "--out" in errors[0] and "Traceback" not in result.stderr
    assert not Path(out).exists()
