"""The options of ``relaylens run`` (and of ``sweep``, which passes them to every shard), declared once, in panels;
plus each analysis's own flags, which the analysis declares in its record
(:attr:`relaylens.experiments.analysis.Analysis.cli_options`) and only that analysis takes.

The analysis flags are read when ``run`` or ``sweep`` parses its arguments or shows its help (:class:`RunCommand`):
reading them imports every analysis, and an analysis's spec validates its selectors (torch), so the other commands
(``figures``, ``report``, ``--help``) start without it.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

import typer
import typer.main
from typer.core import TyperCommand

from relaylens.cli.common import ATTN, DEVICE, DEVICE_MAP, DTYPE, MAX_POS, ROPE, check_key_env, fail, guard, load_kwargs
from relaylens.errors import RelaylensError
from relaylens.model.catalogue import DEFAULT_MODEL  # a name only: importing it loads no model code
from relaylens.scoring.longmemeval_judge import check_template

MODEL, DATA, SELECT, DECODE, JUDGE, OUTPUT = ("Model and placement", "Data", "Selection and conditions", "Decoding",
                                              "Judge", "Output and scale")
FLAGS = "relaylens.analysis_flags"
"""The key of ``typer.Context.meta`` under which :class:`RunCommand` hands the analysis flags' values to the command."""


def option(name: str, annotation, *decls: str, panel: str, **kw) -> inspect.Parameter:
    """A keyword parameter ``name`` declared as a typer option in help panel ``panel``."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=typer.Option(kw.pop("default", None), *decls, rich_help_panel=panel, **kw))


RUN_OPTIONS = [
    option("model", str, default=DEFAULT_MODEL, help="embedded name, local HF dir, .gguf file or hub id", panel=MODEL),
    option("device", str, "--device", help=DEVICE.help, panel=MODEL),
    option("dtype", str, "--dtype", help=DTYPE.help, panel=MODEL),
    option("device_map", str, "--device-map", help=DEVICE_MAP.help, panel=MODEL),
    option("attn_implementation", str, "--attn-implementation", default="sdpa", help=ATTN.help, panel=MODEL),
    option("rope_scaling", str, "--rope-scaling", help=ROPE.help, panel=MODEL),
    option("max_position", int, "--max-position", help=MAX_POS.help, panel=MODEL),
    option("data", str, default="sample", help="dataset file, or 'sample' for the bundled LongMemEval-schema sample",
           panel=DATA),
    option("data_format", str, "--format", default="auto", help="dataset format (auto-detected when unambiguous)",
           panel=DATA),
    option("limit", int, help="first N records (default: the analysis's CPU-sized limit)", panel=DATA),
    option("record_order", str, "--record-order", default="file", help="file (the file's order) or interleave "
           "(round-robin over question types, so that --limit N and a partial run are stratified); applied before "
           "--limit", panel=DATA),
    option("max_history_tokens", int, "--max-history-tokens", help="skip (and record) records whose history is "
           "longer (default: what the rotary range and the largest condition shift allow)", panel=DATA),
    option("granularity", str, help="gold evidence unit for probes and retention: turn or session", panel=DATA),
    option("preset", str, help="named configuration of the analysis: paper (the paper's settings)", panel=SELECT),
    option("selector", list[str], "--selector", help="selector to sweep, NAME[:key=value,...] (repeatable; replaces "
           "the analysis's selectors), e.g. bm25:packing=truncate", panel=SELECT),
    option("condition", list[str], "--condition", help="condition to run (repeatable; original is added when "
           "missing), e.g. relay, query_only(2048), compaction(0.5)", panel=SELECT),
    option("budget", list[float], help="override budgets (repeatable): ratio in (0,1] or states", panel=SELECT),
    option("protect_instructions", bool, "--protect-instructions/--no-protect-instructions",
           help="keep the instruction and chat-template tokens outside the budget (every selector keeps them; the "
           "budget applies to the source text): on by default, the paper's regime; --no-protect-instructions is the "
           "'framing evicted' ablation, named so in the manifest",
           panel=SELECT),
    option("seed", int, default=0, help="seed for random selectors and orders", panel=SELECT),
    option("sweep", str, "--sweep", help="'layers': per-layer causal sweep (relay in layer l only, and in layers 0..l, "
           "for every l): costs one extra question pass per layer and curve for every record (about 2 x layers "
           "passes); off by default; recorded in the manifest", panel=SELECT),
    option("probe", list[str], "--probe", help="probe kind to switch on by name (repeatable): a kind of "
           "relaylens.probes.PROBE_KINDS, a plugin's included; replay, token_view, sensitivity and layer_sweep set "
           "their own switches", panel=SELECT),
    option("stop", str, help="decoding stop: eos, newline or none (fixed length)", panel=DECODE),
    option("max_new_tokens", int, "--max-new-tokens", help="override the decoding limit (default 512, the paper's; "
           "decoding stops earlier at EOS in chat mode)", panel=DECODE),
    option("prompt_mode", str, "--prompt-mode", help="chat, completion or auto (chat where the model has a template)",
           panel=DECODE),
    option("batch_rows", int, "--batch-rows", help="rows (selector x budget x condition) of a record decoded in one "
           "batch (default: all; 1: one at a time, per-request timings)", panel=DECODE),
    option("decoding", str, "--decoding", help="auto (default: the path a resumed run already uses, else static on "
           "the CPU, where it is faster, and dynamic elsewhere), dynamic (the cache grows, stopped rows leave the "
           "batch) or static (preallocated answer slots, stops tested on the device, a host read every 8 steps: "
           "relaylens.generation.static); same tokens in float32, bfloat16 may part at near-tied tokens", panel=DECODE),
    option("compile_backend", str, "--compile-backend", help="static decoding: compile the step as one graph with "
           "this torch.compile backend (inductor, cudagraphs, eager); default: run it eagerly", panel=DECODE),
    option("judge_url", str, "--judge-url", help="OpenAI-compatible base URL of an LLM judge (optional)", panel=JUDGE),
    option("judge_model", str, "--judge-model", help="judge model: name at --judge-url, a local HF model spec, or "
           "'stub' (deterministic local checklist stub, summarization demos/tests)", panel=JUDGE),
    option("judge_key_env", str, "--judge-key-env", help="environment variable with the judge's API key", panel=JUDGE),
    option("judge_template", str, "--judge-template", default="memory_judge_v1", help="memory_judge_v1 (the paper's "
           "judge; scores judge) or longmemeval (LongMemEval's own per-type yes/no prompts, 10 tokens; scores "
           "judge_lme; LongMemEval records only)", panel=JUDGE),
    option("out", Path, help="run directory (default runs/ANALYSIS)", panel=OUTPUT),
    option("shard", str, help="i/n: run the i-th of n deterministic record shards; auto: take i/n from torchrun/"
           "accelerate (RANK, WORLD_SIZE) or SLURM and write OUT/shards/I-of-N", panel=OUTPUT),
    option("force", bool, default=False, help="reuse a run directory whose manifest differs", panel=OUTPUT),
    option("retry_skipped", bool, "--retry-skipped", default=False, help="recompute units recorded as skipped",
           panel=OUTPUT),
    option("view_records", int, "--view-records", default=3, min=0, help="store the token view (per-token attention "
           "of the final question token) for the first N records with probes", panel=OUTPUT),
]
"""The options every analysis takes (the analyses' own flags follow them: :func:`analysis_flags`)."""


def with_run_options(command):
    """Declare :data:`RUN_OPTIONS` as keyword parameters of ``command`` (which takes them as ``**options``)."""
    signature = inspect.signature(command)
    fixed = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    command.__signature__ = signature.replace(parameters=fixed + RUN_OPTIONS)
    return command


# --- the analyses' own flags ------------------------------------------------------------------------------------------

@functools.cache
def analysis_flags() -> dict:
    """``keyword -> (analysis record, CliOption)`` for the flags every analysis declares, in analysis order. A flag
    declared twice (by two analyses, or by an analysis and :data:`RUN_OPTIONS`) is refused."""
    from relaylens.experiments.specs import available_analyses, load_analysis  # noqa: PLC0415 - late binding (tests swap specs.load_analysis); CLI startup (the wall of the module docstring)

    shared = {p.name for p in RUN_OPTIONS}
    out: dict = {}
    for name in available_analyses():
        record = load_analysis(name)
        for flag in record.cli_options:
            if flag.name in shared or flag.name in out:
                owner = "relaylens run itself" if flag.name in shared else f"analysis {out[flag.name][0].name}"
                raise RelaylensError(f"analysis {name} declares {flag.flag}, which {owner} declares too. Fix: give "
                                     f"the flag another name in relaylens/analyses/{name}.py")
            out[flag.name] = (record, flag)
    return out


def flag_params() -> list:
    """The click options of :func:`analysis_flags`, each in its analysis's help panel (built by typer itself, from a
    signature, as every other option)."""

    def flags(**values) -> None:
        """The analyses' own flags."""

    flags.__signature__ = inspect.Signature([option(flag.name, flag.type, flag.flag, help=flag.help,
                                                    panel=record.cli_panel)
                                             for record, flag in guard(analysis_flags).values()])
    holder = typer.Typer(add_completion=False)
    holder.command()(flags)
    return list(typer.main.get_command(holder).params)


class RunCommand(TyperCommand):
    """``run`` and ``sweep``: :data:`RUN_OPTIONS` from the signature, then the analyses' own flags
    (:func:`flag_params`), added the first time the command's parameters are read (to parse, to show help, or to
    document them). Typer hands the command only the parameters of its signature, so :meth:`invoke` moves the flags'
    values to ``ctx.meta[FLAGS]`` (:func:`flag_values`; the command takes the context as ``ctx: typer.Context``)."""

    @property
    def params(self) -> list:
        if not self.flags_added:
            self.flags_added = True
            self.declared.extend(flag_params())
        return self.declared

    @params.setter
    def params(self, value: list) -> None:
        self.declared, self.flags_added = value, False

    def invoke(self, ctx: typer.Context):
        ctx.meta[FLAGS] = {name: ctx.params.pop(name) for name in guard(analysis_flags) if name in ctx.params}
        return super().invoke(ctx)


def flag_values(ctx: typer.Context) -> dict:
    """The analysis flags given to the running ``run`` or ``sweep`` (``keyword -> value``; None: not given)."""
    return ctx.meta.get(FLAGS, {})


def analysis_options(record, values: dict):
    """``record.options`` with the flags in ``values`` applied (None for an analysis without options); a flag of
    another analysis is refused in one line."""
    given = {name: value for name, value in values.items() if value is not None}
    own = {flag.name for flag in record.cli_options}
    foreign: dict[str, list[str]] = {}
    for name in given:
        if name not in own:
            owner, flag = analysis_flags()[name]
            foreign.setdefault(owner.name, []).append(flag.flag)
    if foreign:
        fail("; ".join(f"{', '.join(flags)} apply to {owner} only" for owner, flags in foreign.items())
             + f"; analysis {record.name} has no such option")
    return guard(record.with_flags, given)


def spec_and_config(p: dict):
    """The analysis spec and run config of the `run` options ``p`` (by parameter name; shared by `run` and `sweep`)."""
    from relaylens.datasets.ordering import check_record_order  # noqa: PLC0415 - CLI startup
    from relaylens.experiments.config import RunConfig, check_decoding  # noqa: PLC0415 - CLI startup
    from relaylens.experiments.judges import check_judge_records  # noqa: PLC0415 - CLI startup
    from relaylens.experiments.presets import apply_preset  # noqa: PLC0415 - CLI startup
    from relaylens.experiments.specs import apply_overrides, load_analysis  # noqa: PLC0415 - late binding (tests swap specs.load_analysis); CLI startup

    record = guard(load_analysis, p["analysis"])
    spec = guard(apply_preset, record, p["preset"])
    spec = guard(apply_overrides, spec, selectors=list(p["selector"] or []) or None,
                 conditions=list(p["condition"] or []) or None, budgets=tuple(p["budget"]) if p["budget"] else None,
                 max_new_tokens=p["max_new_tokens"], prompt_mode=p["prompt_mode"], granularity=p["granularity"],
                 stop=p["stop"], sweep=p["sweep"], protect_instructions=p["protect_instructions"],
                 probe_kinds=tuple(p["probe"]) if p["probe"] else None)
    placement = {k: p[k] for k in ("device", "dtype", "device_map", "attn_implementation", "rope_scaling",
                                   "max_position")}
    load_kwargs(**placement)  # bad values: one line, early
    check_key_env(p["judge_url"], p["judge_key_env"])
    config = RunConfig(model=p["model"], data=p["data"], data_format=p["data_format"], limit=p["limit"],
                       record_order=guard(check_record_order, p["record_order"] or "file"),
                       out=str(p["out"]) if p["out"] else None, shard=p["shard"], seed=p["seed"], force=p["force"],
                       judge_url=p["judge_url"], judge_model=p["judge_model"], judge_key_env=p["judge_key_env"],
                       judge_template=guard(check_template, p["judge_template"]),
                       max_history_tokens=p["max_history_tokens"], retry_skipped=p["retry_skipped"],
                       view_records=p["view_records"],
                       decoding=guard(check_decoding, p["decoding"] or "auto", p["compile_backend"]),
                       compile_backend=p["compile_backend"], **placement,
                       batch_rows=p["batch_rows"] if p["batch_rows"] is not None else record.batch_rows)
    guard(check_judge_records, spec, config)  # LongMemEval's prompts on other records: refused before the model loads
    return spec, config
