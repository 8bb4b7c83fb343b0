"""The run configuration: everything a run depends on besides the analysis spec (all of it recorded in the
manifest), and the checks that refuse a configuration before any file is written.

Example:
    >>> config = RunConfig(limit=4, out="runs/ablation")
    >>> config.model, config.data, config.chunk_size
    ('smollm2-135m-instruct', 'sample', 2048)
    >>> check_config(RunConfig(limit=0))
    Traceback (most recent call last):
    ...
    relaylens.errors.RelaylensError: limit must be a positive number of records; got 0. Fix: pass --limit N with N >= 1, or omit it for the analysis's default
"""  # noqa: E501 - doctest: an exception message is matched on one line

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from relaylens.datasets import SAMPLE, load_records, resolve_data
from relaylens.datasets.ordering import check_record_order, order_records
from relaylens.errors import RelaylensError
from relaylens.model.embedded import DEFAULT_MODEL
from relaylens.scoring.longmemeval_judge import check_template


@dataclass
class RunConfig:
    """Everything a run depends on besides the analysis spec (all recorded in the manifest)."""

    model: str = DEFAULT_MODEL
    data: str = SAMPLE
    data_format: str = "auto"
    limit: int | None = None
    record_order: str = "file"  # or "interleave": round-robin over question types, before --limit (datasets.ordering)
    out: str | None = None
    shard: str | None = None
    seed: int = 0
    window_size: int = 32
    chunk_size: int | None = 2048
    window_mode: str = "condition"
    force: bool = False
    judge_url: str | None = None  # OpenAI-compatible endpoint for the memory_judge_v1 judge (optional)
    judge_model: str | None = None  # model name at that endpoint, or a local HF judge model spec
    judge_key_env: str | None = None  # environment variable holding the endpoint's API key
    judge_template: str = "memory_judge_v1"  # or "longmemeval": LongMemEval's own prompts (scores judge_lme)
    device: str | None = None  # cpu, cuda, cuda:N, mps, auto (None: cpu); exclusive with device_map
    dtype: str | None = None  # float32, bfloat16, float16 (None: float32 on CPU, bfloat16 on CUDA)
    device_map: str | None = None  # accelerate device map ("auto") for models that do not fit one device
    attn_implementation: str = "sdpa"  # kernel the model loads with and the history prefill runs with
    rope_scaling: str | None = None  # rotary override applied before the weights load, e.g. "yarn:4:32768"
    max_position: int | None = None  # max_position_embeddings override
    max_history_tokens: int | None = None  # longer histories are skipped and recorded (None: the rotary range)
    retry_skipped: bool = False  # recompute units recorded as skipped (e.g. after raising max_history_tokens)
    view_records: int = 3  # token view data (RUN_DIR/views) for the first N records with probes (0: none)
    batch_rows: int | None = None  # rows (unit x condition) of a record decoded together; None: all; 1: sequential
    decoding: str = "auto"  # dynamic, static (generation.static) or auto: generation.settings.resolve_decoding
    compile_backend: str | None = None  # static decoding: torch.compile backend of the step (None: eager)

    def placement(self, local_rank: int | None = None):
        """The resolved :class:`relaylens.model.placement.Placement` of this run (``local_rank``: the launcher's, which
        ``--device auto`` turns into ``cuda:LOCAL_RANK``)."""
        from relaylens.model.placement import Placement  # noqa: PLC0415 - import cost: torch loads on first use

        return Placement.resolve(self.device, self.dtype, self.device_map, self.attn_implementation, self.rope_scaling,
                                 self.max_position, local_rank=local_rank)


def check_config(config: RunConfig) -> None:
    """Refuse a :class:`RunConfig` that would silently misbehave, before any file is written."""
    from relaylens.generation.attention import WINDOW_MODES  # noqa: PLC0415 - import cost: torch and transformers load on first use

    if config.limit is not None and (isinstance(config.limit, bool) or not isinstance(config.limit,
                                                                                      int) or config.limit < 1):
        raise RelaylensError(f"limit must be a positive number of records; got {config.limit!r}. Fix: pass --limit N "
                             "with N >= 1, or omit it for the analysis's default")
    if isinstance(config.window_size, bool) or not isinstance(config.window_size, int) or config.window_size < 1:
        raise RelaylensError(f"window_size must be a positive number of tokens; got {config.window_size!r}")
    if config.chunk_size is not None and (not isinstance(config.chunk_size, int) or config.chunk_size < 1):
        raise RelaylensError(f"chunk_size must be a positive number of tokens or None; got {config.chunk_size!r}")
    if config.batch_rows is not None and (isinstance(config.batch_rows, bool) or not isinstance(config.batch_rows, int)
                                          or config.batch_rows < 1):
        raise RelaylensError(f"batch_rows must be a positive number of rows or None (all rows of a record); got "
                             f"{config.batch_rows!r}. Fix: pass --batch-rows N with N >= 1")
    if isinstance(config.seed, bool) or not isinstance(config.seed, int) or not 0 <= config.seed < 2**63:
        raise RelaylensError(f"seed must be a whole number in 0..2**63-1 (it seeds random selectors); got "
                             f"{config.seed!r}. Fix: pass --seed N with N >= 0")

    check_decoding(config.decoding, config.compile_backend)
    check_template(config.judge_template)
    check_record_order(config.record_order)
    if config.window_mode not in WINDOW_MODES:
        raise RelaylensError(f"window_mode must be one of {WINDOW_MODES}; got {config.window_mode!r}")
    if config.max_history_tokens is not None and (not isinstance(config.max_history_tokens,
                                                                 int) or config.max_history_tokens < 1):
        raise RelaylensError("max_history_tokens must be a positive number of tokens; got "
                             f"{config.max_history_tokens!r}")


def check_decoding(decoding: str, compile_backend: str | None) -> str:
    """``decoding`` when it and ``compile_backend`` make a decoding path (``auto`` checked as the path it picks on
    the CPU; :class:`relaylens.generation.settings.DecodeSettings` says why not)."""
    from relaylens.generation.settings import (  # noqa: PLC0415 - import cost: torch loads on first use
        DecodeSettings,
        resolve_decoding,
    )

    path = resolve_decoding(decoding, None, compile_backend=compile_backend)  # an unknown name fails here
    DecodeSettings(decoding=path, compile_backend=compile_backend)
    return decoding


def run_records(spec, config: RunConfig) -> tuple[Path, list]:
    """``(data path, records)`` a run of ``spec`` under ``config`` reads, before any shard takes its share: the
    analysis's own sample when ``config.data`` is ``sample`` (else ``config.data``), loaded, put in
    ``config.record_order``, then the first ``config.limit`` (the analysis's ``limit`` when unset; 0 or None: all).
    The runners, the judge's record check and the sweep's shard plan all read the records through it.

    >>> from relaylens.experiments.specs import load_analysis
    >>> path, records = run_records(load_analysis("coordinate_ablation").spec, RunConfig(limit=3))
    >>> path.name, len(records)
    ('sample_longmemeval.json', 3)
    """
    data_path = resolve_data(spec.data if config.data == SAMPLE else config.data)  # an analysis may bring its sample
    records = load_records(data_path, format=config.data_format)
    if not records:
        raise RelaylensError(f"{data_path} holds no records. Fix: pass --data with a file that holds records")
    records = order_records(records, config.record_order)  # before the limit: a prefix of the chosen order
    limit = config.limit if config.limit is not None else spec.limit
    return data_path, records[:limit] if limit else records
