"""One frozen object for everything a decode corridor call shares across its rows: limits, stops, windows, the path.

:func:`relaylens.generation.rows.run_rows`, :func:`relaylens.generation.single.run_condition` and
:func:`relaylens.probes.readouts.probe_condition` / ``probe_rows`` take ``settings=DecodeSettings(...)``; the loose
keywords they took before (``max_new_tokens=``, ``eos_token_ids=``, ``tokenizer=``, ``stop_at_newline=``,
``window_mode=``, ``factors=``) still work and fill the same object (:meth:`DecodeSettings.build`), so a run builds its
settings once (:attr:`relaylens.experiments.walk.RunWalk.decode_settings`) and every batch of it carries that one.

Example:
    >>> settings = DecodeSettings(max_new_tokens=8, stop_at_newline=True)
    >>> DecodeSettings.build(settings, max_new_tokens=4).max_new_tokens
    4
    >>> DecodeSettings.build(None, max_tokens=4)
    Traceback (most recent call last):
    ...
    relaylens.errors.RelaylensError: unknown decode setting(s) ['max_tokens']; known: ['compile_backend', 'decoding', \
'eos_token_ids', 'factors', 'max_new_tokens', 'stop_at_newline', 'sync_every', 'tokenizer', 'window_mode']. \
Fix: spell them as relaylens.generation.settings.DecodeSettings names them
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from relaylens.errors import RelaylensError

DECODING_PATHS = ("dynamic", "static")
DECODING_CHOICES = ("auto", *DECODING_PATHS)
"""What a run may ask for (``--decoding``): a path, or ``auto`` (:func:`resolve_decoding`)."""


def resolve_decoding(decoding: str, device: str | None, *, device_map: str | None = None,
                     compile_backend: str | None = None, resumed: str | None = None) -> str:
    """The decoding path a run uses: ``decoding`` itself unless it is ``"auto"``, which picks, in order, the path
    the run directory already decodes with (``resumed``: a run never changes path mid-way), ``static`` where a
    compile backend is set (it compiles the static step), ``static`` on the CPU (measured faster there: 1.26x on
    10 real 8k records, docs/performance.md) and ``dynamic`` elsewhere (the static step is not yet measured on a
    GPU, issue 51; nor across a device map).

    >>> resolve_decoding("auto", None), resolve_decoding("auto", "cuda:0"), resolve_decoding("dynamic", "cpu")
    ('static', 'dynamic', 'dynamic')
    >>> resolve_decoding("auto", "cpu", resumed="dynamic")
    'dynamic'
    """
    if decoding not in DECODING_CHOICES:
        raise RelaylensError(f"decoding must be one of {DECODING_CHOICES}; got {decoding!r}. Fix: pass one of those "
                             "(--decoding)")
    if decoding != "auto":
        return decoding
    if resumed is not None:
        return resumed
    if compile_backend is not None:
        return "static"
    on_cpu = device_map is None and (device is None or str(device).split(":")[0] == "cpu")
    return "static" if on_cpu else "dynamic"


@dataclass(frozen=True)
class DecodeSettings:
    """What every row of a decode shares.

    Attributes:
        max_new_tokens: decoding limit (0: question pass only).
        eos_token_ids: stop tokens (None: the model's ``generation_config`` / ``config`` / tokenizer EOS ids; an empty
            set: no EOS stop).
        tokenizer: decodes the answer text; needed for ``stop_at_newline``.
        stop_at_newline: stop a row at the first newline after its answer's leading newlines (short-answer prompts).
        window_mode: sliding-window layers under a relocated cache
            (:class:`~relaylens.generation.attention.AttentionState`).
        factors: the model's rotary factors (None: read from the model).
        decoding: ``"dynamic"`` (the cache grows, stopped rows leave the batch, the host reads every step; the default
            of a library call) or ``"static"`` (:mod:`relaylens.generation.static`: preallocated answer slots, stopped
            rows masked, stops tested on the device, a host read every ``sync_every`` steps); a run's
            ``--decoding auto`` picks one with :func:`resolve_decoding`.
        sync_every: static decoding: steps between host reads of "every row stopped".
        compile_backend: static decoding: ``None`` runs the step eagerly; a ``torch.compile`` backend name
            (``"inductor"``, ``"cudagraphs"``, ``"eager"``) compiles it as one graph.
    """

    max_new_tokens: int = 32
    eos_token_ids: frozenset[int] | None = None
    tokenizer: object = field(default=None, compare=False, repr=False)
    stop_at_newline: bool = False
    window_mode: str = "condition"
    factors: object = field(default=None, compare=False, repr=False)
    decoding: str = "dynamic"
    sync_every: int = 8
    compile_backend: str | None = None

    def __post_init__(self) -> None:
        if self.eos_token_ids is not None and not isinstance(self.eos_token_ids, frozenset):
            object.__setattr__(self, "eos_token_ids", frozenset(int(i) for i in self.eos_token_ids))
        if self.decoding not in DECODING_PATHS:
            raise RelaylensError(f"decoding must be one of {DECODING_PATHS}; got {self.decoding!r}. Fix: pass one of "
                                 "those (--decoding)")
        if int(self.sync_every) < 1:
            raise RelaylensError(f"sync_every must be at least 1 step; got {self.sync_every}. Fix: pass a positive "
                                 "number of steps")
        if self.compile_backend is not None and self.decoding != "static":
            raise RelaylensError(f"compile_backend={self.compile_backend!r} compiles the static decoding step, but "
                                 f"decoding={self.decoding!r}. Fix: pass decoding='static' or no compile backend")

    @classmethod
    def build(cls, settings: DecodeSettings | None = None, **options) -> DecodeSettings:
        """``settings`` (default: the defaults) with ``options`` (loose keywords of the older signatures) applied."""
        known = sorted(f.name for f in dataclasses.fields(cls))
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise RelaylensError(f"unknown decode setting(s) {unknown}; known: {known}. Fix: spell them as "
                                 "relaylens.generation.settings.DecodeSettings names them")
        base = settings if settings is not None else cls()
        return dataclasses.replace(base, **options) if options else base
