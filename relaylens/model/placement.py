"""Where and how a model is loaded: device, dtype, device map, attention kernel, and rotary overrides.

Everything here is resolved *before* the weights load and recorded in the run manifest
(:meth:`Placement.to_dict`). Relocation always computes in float32 and casts back to the cache dtype
(:func:`relaylens.geometry.rotary.relocate_keys`); the question pass keeps its float32 softmax.

Rotary overrides change the config the weights load into, so a model runs with the paper's static YaRN x4 / 131,072
without editing ``config.json``: ``--rope-scaling yarn:4:32768 --max-position 131072``. Every value is checked here,
before anything loads: rope parameters are finite and in range (:func:`parse_rope_scaling`; transformers itself only
warns), ``--max-position`` is a whole number in ``1 .. 2**24`` (:func:`check_max_position`), and the attention kernel
exists and can run here (:func:`check_attn_implementation`).

Example:
    >>> parse_rope_scaling("yarn:4:32768")
    {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 32768}
    >>> spec = "llama3:factor=8,low_freq_factor=1,high_freq_factor=4,original_max_position_embeddings=8192"
    >>> parse_rope_scaling(spec)["rope_type"]
    'llama3'
    >>> resolve_device("cpu"), resolve_dtype(None, "cpu")
    ('cpu', torch.float32)
"""

from __future__ import annotations

import math
import os
import platform
import warnings
from dataclasses import asdict, dataclass

import torch

from relaylens.errors import RelaylensError
from relaylens.model.hf import POSITION_LIMIT

__all__ = ["Placement", "resolve_device", "resolve_dtype", "choose_dtype", "choose_dtypes", "bfloat16_native",
           "machine_stamp", "cpu_model_name", "cpu_flags", "parse_rope_scaling", "apply_rope_override", "DTYPES",
           "ROPE_OVERRIDE_PARAMS", "ATTENTION_KERNELS", "check_attn_implementation", "check_max_position"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

ROPE_OVERRIDE_PARAMS = {
    "yarn": ("factor", "original_max_position_embeddings"),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
"""Positional parameters of ``--rope-scaling TYPE:P1:P2...`` per rope type (also accepted as ``key=value``)."""

_REQUIRED = {"yarn": ("factor",), "linear": ("factor",), "llama3": ROPE_OVERRIDE_PARAMS["llama3"]}
_INT_PARAMS = {"original_max_position_embeddings"}
_RANGES = {  # parameter -> (smallest, largest, why); every value must also be finite
    "factor": (1.0, POSITION_LIMIT, "a factor stretches positions: below 1 it compresses nothing (transformers' own "
               "rule), past 2**24 every position relaylens accepts falls inside one original position"),
    "original_max_position_embeddings": (1, POSITION_LIMIT, "a context length: a whole number of positions"),
    "low_freq_factor": (1e-6, POSITION_LIMIT, "a wavelength divisor: positive"),
    "high_freq_factor": (1e-6, POSITION_LIMIT, "a wavelength divisor: positive, above low_freq_factor"),
}

ATTENTION_KERNELS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
"""Attention kernels the model may load with (the history prefill's kernel; the question pass is relaylens's own)."""


class PlacementError(RelaylensError):
    """A device, dtype or rotary override that cannot be honoured."""


def resolve_device(spec: str | None = "auto", local_rank: int | None = None) -> str:
    """The concrete device for ``spec``: ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or ``auto``.

    ``auto`` picks ``cuda:LOCAL_RANK`` when CUDA is available (``local_rank`` argument, else the ``LOCAL_RANK``
    environment variable set by torchrun / accelerate, else 0), then ``mps``, then ``cpu``.

    >>> resolve_device("auto") if not torch.cuda.is_available() and not torch.backends.mps.is_available() else "cpu"
    'cpu'
    """
    spec = (spec or "auto").strip().lower()
    cuda = torch.cuda.is_available()
    if spec == "auto":
        if cuda:
            rank = local_rank if local_rank is not None else int(os.environ.get("LOCAL_RANK", "0") or 0)
            return f"cuda:{rank % max(torch.cuda.device_count(), 1)}"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    if spec == "cpu":
        return "cpu"
    if spec == "mps":
        if not torch.backends.mps.is_available():
            raise PlacementError("--device mps: this machine has no Apple MPS backend. Fix: --device cpu or auto")
        return "mps"
    if spec == "cuda" or spec.startswith("cuda:"):
        if not cuda:
            raise PlacementError(f"--device {spec}: CUDA is not available on this machine (torch {torch.__version__}). "
                                 "Fix: --device cpu, or --device auto to use a GPU only where there is one")
        if spec == "cuda":
            return "cuda"
        index = spec.partition(":")[2]
        if not index.isdigit() or int(index) >= torch.cuda.device_count():
            raise PlacementError(f"--device {spec}: no such GPU; this machine has {torch.cuda.device_count()} "
                                 f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
        return spec
    raise PlacementError(f"--device {spec!r} is not a device; choose cpu, cuda, cuda:N, mps or auto")


def resolve_dtype(name: str | torch.dtype | None, device: str) -> torch.dtype:
    """The torch dtype for ``name`` (``float32``, ``bfloat16``, ``float16``, ``auto``); default (None) float32 on
    CPU/MPS, bfloat16 on CUDA. ``auto``: float32 where the device has no native bfloat16; bfloat16 on such a GPU;
    on such a CPU, the dtype that decodes faster there, measured (:func:`choose_dtype`,
    :mod:`relaylens.model.dtype_auto`). An explicit bfloat16 on a CPU without native support warns once (slow, not
    wrong)."""
    return choose_dtype(name, device)[0]


def choose_dtype(name: str | torch.dtype | None, device: str) -> tuple[torch.dtype, str | None]:
    """``(dtype, reason)``: the dtype :func:`resolve_dtype` picks and, for ``auto``, why (for the run manifest).

    >>> choose_dtype("float32", "cpu")
    (torch.float32, None)
    >>> choose_dtype("auto", "cpu")[1].startswith("auto: ")
    True
    """
    dtype, _, reason = choose_dtypes(name, device)
    return dtype, reason


def choose_dtypes(name: str | torch.dtype | None, device: str) -> tuple[torch.dtype, torch.dtype | None, str | None]:
    """``(dtype, decoding dtype, reason)``: :func:`choose_dtype` per phase. The decoding dtype is None except where
    ``--dtype auto`` measured this CPU decoding faster in another dtype than it prefills in (the model loads in
    ``dtype``; its decoding steps' linear layers compute in the other, :mod:`relaylens.model.packed`).

    >>> choose_dtypes("bfloat16", "cpu")[:2]
    (torch.bfloat16, None)
    """
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise PlacementError(f"dtype {name} is not supported; choose one of {', '.join(DTYPES)}")
        dtype = name
    elif name is None:
        return (torch.bfloat16 if str(device).startswith("cuda") else torch.float32), None, None
    else:
        key = str(name).strip().lower().removeprefix("torch.")
        aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
        key = aliases.get(key, key)
        if key == "auto":
            return _auto(device)
        if key not in DTYPES:
            raise PlacementError(f"--dtype {name!r} is not supported; choose one of {', '.join(DTYPES)} or auto")
        dtype = DTYPES[key]
    if dtype == torch.bfloat16 and str(device).startswith("cpu"):
        native, why = bfloat16_native(device)
        if not native:
            _warn_once("bfloat16-cpu",
                       f"--dtype bfloat16 on this CPU runs without native bfloat16 instructions ({why}): "
                       "`relaylens run` computes its bfloat16 matrix products with float32 kernels (results rounded "
                       "to bfloat16, relaylens.model.upcast); elsewhere they are emulated, several times slower than "
                       "float32. Fix: --dtype float32, or --dtype auto (bfloat16 only where the hardware runs it)")
    return dtype, None, None


def _auto(device: str) -> tuple[torch.dtype, torch.dtype | None, str]:
    """``--dtype auto``: float32 where the device has no native bfloat16; on a CPU that has it, per phase the dtype
    this machine runs faster, measured once and cached (:mod:`relaylens.model.dtype_auto`)."""
    from relaylens.model import dtype_auto  # noqa: PLC0415 - import cost: only --dtype auto needs it

    native, why = bfloat16_native(device)
    if native and str(device).startswith("cpu") and not dtype_auto.skip_measurement():
        measurement, cached = dtype_auto.measured(cpu_flags())
        prefill, decode = dtype_auto.choose(measurement)
        chosen = prefill if prefill == decode else f"{prefill} prefill, {decode} decoding linear layers"
        return DTYPES[prefill], (None if decode == prefill else DTYPES[decode]), (
            f"auto: {chosen}, {why}; measured on this machine ({'cached' if cached else 'now'}): "
            f"{measurement.describe()}")
    return (torch.bfloat16 if native else torch.float32), None, f"auto: {'bfloat16' if native else 'float32'}, {why}"


_WARNED: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)

        warnings.warn(message, RuntimeWarning, stacklevel=4)


#: CPU feature flags (Linux ``/proc/cpuinfo`` names) that run bfloat16 matrix products natively.
BF16_CPU_FLAGS = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}


def bfloat16_native(device: str = "cpu") -> tuple[bool, str]:
    """``(native, why)``: whether ``device`` runs bfloat16 matrix products in hardware, detected (never assumed).

    CUDA: ``torch.cuda.is_bf16_supported()``. CPU: the AMX-BF16 / AVX512-BF16 flags of ``/proc/cpuinfo`` (Linux;
    elsewhere none are found and float32 is the safe answer). ``RELAYLENS_CPU_FLAGS`` (space-separated) replaces the
    flags read, for tests.
    """
    device = str(device)
    if device.startswith("cuda"):
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, ("CUDA device supports bfloat16" if ok else "this CUDA device has no native bfloat16")
    if device.startswith("mps"):
        return False, "MPS: bfloat16 not assumed native"
    flags = cpu_flags()
    found = [label for flag, label in BF16_CPU_FLAGS.items() if flag in flags]
    if found:
        return True, f"CPU reports {' and '.join(found)}"
    return False, "CPU reports neither AMX-BF16 nor AVX512-BF16" if flags else "CPU feature flags unavailable"


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; ``RELAYLENS_CPU_FLAGS`` overrides), empty where unknown."""
    override = os.environ.get("RELAYLENS_CPU_FLAGS")
    if override is not None:
        return frozenset(override.split())
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def machine_stamp(device: str = "cpu", products: str | None = None) -> dict[str, str | int]:
    """What computed a unit of a run: the device's name, its native bfloat16 support and torch's thread count;
    ``products``, where given, how its bfloat16 matrix products were computed (:mod:`relaylens.model.upcast`).

    Runs span sessions, and sessions do not always get the same machine; a unit file carries the stamp of the
    machine that computed it (:meth:`relaylens.results.store.RunStore.write_unit`), so a reader can tell which units
    came from which CPU or GPU. CPU: :func:`cpu_model_name`; ``bf16``: :func:`bfloat16_native`'s reason.
    ``RELAYLENS_CPU_FLAGS`` replaces the flags read, for tests.

    >>> stamp = machine_stamp("cpu")
    >>> sorted(stamp), stamp["device"]
    (['bf16', 'device', 'name', 'threads'], 'cpu')
    """
    device = str(device)
    if device.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = cpu_model_name()
    stamp = {"device": device, "name": name, "bf16": bfloat16_native(device)[1], "threads": torch.get_num_threads()}
    return stamp if products is None else stamp | {"products": products}


def cpu_model_name(text: str | None = None) -> str:
    """The CPU's name in a ``/proc/cpuinfo`` text (``None``: this machine's, where it can be read): the first
    ``model name`` / ``cpu model`` / ``hardware`` line; ``platform.processor()`` where there is none.

    >>> cpu_model_name("processor\\t: 0\\nmodel name\\t: AMD EPYC 9R14\\nflags\\t\\t: fpu avx2\\n")
    'AMD EPYC 9R14'
    """
    if text is None:
        try:
            with open("/proc/cpuinfo") as handle:
                text = handle.read()
        except OSError:
            text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("model name", "cpu model", "hardware") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def parse_rope_scaling(text: str | dict | None) -> dict | None:
    """``TYPE:P1:P2...`` or ``TYPE:key=value,...`` -> the rope parameters to set (without ``rope_theta``).

    Types and positional parameters: :data:`ROPE_OVERRIDE_PARAMS`; ``none`` removes nothing and returns None. Values
    must be finite and in range (factor ``1 .. 2**24``, ``original_max_position_embeddings`` a whole number
    ``1 .. 2**24``, llama3's ``high_freq_factor > low_freq_factor > 0``); a dict is checked the same way.

    >>> parse_rope_scaling("linear:inf")
    Traceback (most recent call last):
    ...
    relaylens.model.placement.PlacementError: --rope-scaling 'linear:inf': factor=inf is not a finite number. Fix: give a finite factor (e.g. linear:4)
    """  # noqa: E501 - doctest: an exception message is matched on one line
    if text is None or isinstance(text, dict):
        return _checked_rope(dict(text), text) if text else None
    rope_type, _, rest = str(text).strip().partition(":")
    rope_type = rope_type.strip().lower()
    if rope_type in ("", "none"):
        return None
    if rope_type not in ROPE_OVERRIDE_PARAMS:
        raise PlacementError(f"--rope-scaling {text!r}: unknown type {rope_type!r}; choose one of "
                             f"{', '.join(ROPE_OVERRIDE_PARAMS)} (e.g. yarn:4:32768)")
    names = ROPE_OVERRIDE_PARAMS[rope_type]
    params: dict = {"rope_type": rope_type}
    parts = [p.strip() for p in (rest.split(",") if "=" in rest else rest.split(":")) if p.strip()]
    if len(parts) > len(names) and "=" not in rest:
        raise PlacementError(f"--rope-scaling {text!r}: {rope_type} takes at most {len(names)} values "
                             f"({':'.join(names)})")
    for i, part in enumerate(parts):
        key, value = part.split("=", 1) if "=" in part else (names[i], part)
        key = key.strip()
        if key not in names:
            raise PlacementError(f"--rope-scaling {text!r}: {rope_type} has no parameter {key!r}; it takes "
                                 f"{', '.join(names)}")
        try:
            params[key] = float(value)
        except ValueError:
            raise PlacementError(f"--rope-scaling {text!r}: {key}={value!r} is not a number") from None
    missing = [n for n in _REQUIRED[rope_type] if n not in params]
    if missing:
        raise PlacementError(f"--rope-scaling {text!r}: {rope_type} needs {', '.join(missing)} "
                             f"(form {rope_type}:{':'.join(names)})")
    return _checked_rope(params, text)


def _checked_rope(params: dict, text) -> dict:
    """``params`` with every number finite and in range (:data:`_RANGES`), whole-number parameters as ints."""
    shown = f"--rope-scaling {text!r}" if isinstance(text, str) else f"rope parameters {text!r}"
    example = {"yarn": "yarn:4:32768", "llama3": "llama3:8:1:4:8192"}.get(str(params.get("rope_type")), "linear:4")
    for key, value in params.items():
        if key == "rope_type" or isinstance(value, (str, list, dict, type(None))):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise PlacementError(f"{shown}: {key}={value!r} is not a finite number. Fix: give a finite {key} "
                                 f"(e.g. {example})")
        low, high, why = _RANGES.get(key, (-math.inf, math.inf, ""))
        if value <= 0 < low:
            raise PlacementError(f"{shown}: {key} must be positive; got {value!r}. Fix: e.g. {example}")
        if not low <= value <= high or (key in _INT_PARAMS and not float(value).is_integer()):
            span = f"{low:g}..{high:,}" if high == POSITION_LIMIT else f"{low:g}..{high:g}"
            bounds = f"a whole number in {span}" if key in _INT_PARAMS else f"in {span}"
            raise PlacementError(f"{shown}: {key}={value!r} must be {bounds} ({why}). Fix: e.g. {example}")
        if key in _INT_PARAMS:
            params[key] = int(value)
    if params.get("high_freq_factor", math.inf) <= params.get("low_freq_factor", -math.inf):
        raise PlacementError(f"{shown}: high_freq_factor={params['high_freq_factor']:g} must exceed low_freq_factor="
                             f"{params['low_freq_factor']:g} (llama3 divides by their difference). Fix: e.g. {example}")
    return params


def check_max_position(value) -> int:
    """``--max-position`` as an int: a whole number in ``1 .. 2**24`` (:data:`~relaylens.model.hf.POSITION_LIMIT`;
    larger positions share float32 phases, so a larger context cannot be told apart)."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or not 1 <= value <= POSITION_LIMIT:
        raise PlacementError(f"--max-position must be a whole number of positions in 1..{POSITION_LIMIT:,} (2**24: "
                             f"the rotary embedding computes phases from float32 positions, which cannot tell larger "
                             f"positions apart); got {value!r}. Fix: e.g. --max-position 131072")
    return int(value)


def check_attn_implementation(name: str | None, device: str | None = None) -> str:
    """The attention kernel to load with (``None``: sdpa), refused when it is unknown or cannot run here (flash
    attention without its package or a CUDA device), before any weight loads."""
    name = "sdpa" if name is None else str(name).strip()
    fix = "Fix: --attn-implementation sdpa (the default) or eager"
    if name not in ATTENTION_KERNELS:
        raise PlacementError(f"--attn-implementation {name!r} is not an attention kernel relaylens loads with; choose "
                             f"one of {', '.join(ATTENTION_KERNELS)}. {fix}")
    if name in ("sdpa", "eager"):
        return name
    from transformers import utils as hf_utils  # noqa: PLC0415 - import cost: transformers loads on first use

    available = {"flash_attention_2": hf_utils.is_flash_attn_2_available, "flash_attention_3":
                 hf_utils.is_flash_attn_3_available, "flex_attention": hf_utils.is_torch_flex_attn_available}[name]
    if name.startswith("flash"):
        # the package: flash-attn itself, or a hub kernel through the kernels package (transformers >= 5.25
        # installs kernels, so on a CPU machine the GPU is what is missing)
        package = available() or hf_utils.is_kernels_available()
        gpu = str(device).startswith("cuda") if device is not None else torch.cuda.is_available()
        missing = [what for what, ok in (("a CUDA GPU", gpu), ("the flash-attn package", package)) if not ok]
        if missing:
            where = f"; the model goes to {device}" if device is not None else ""
            raise PlacementError(f"--attn-implementation {name} needs a CUDA GPU and the flash-attn package (or a hub "
                                 f"kernel through the kernels package); missing here: {' and '.join(missing)}{where} "
                                 f"(pip install flash-attn on a CUDA machine). {fix}")
    if not available():
        raise PlacementError(f"--attn-implementation {name} is not available with torch {torch.__version__}. {fix}")
    return name


def apply_rope_override(config, rope_scaling: dict | None = None, max_position: int | None = None) -> list[str]:
    """Change ``config`` in place before the weights load; return human-readable notes of what changed.

    The override replaces the rope type and its parameters and keeps the model's ``rope_theta``. Configs with one
    rotary per layer type (Gemma-3) get it on their ``full_attention`` layers only (the global, long-range ones).
    ``yarn`` without ``original_max_position_embeddings`` takes the config's current ``max_position_embeddings``.
    """
    notes = []
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if rope_scaling:
        params = getattr(text, "rope_parameters", None) or {}
        per_type = isinstance(params, dict) and "full_attention" in params and isinstance(params["full_attention"],
                                                                                          dict)
        base = params["full_attention"] if per_type else params
        new = {"rope_theta": base.get("rope_theta", getattr(text, "rope_theta", 10000.0)), **rope_scaling}
        if "partial_rotary_factor" in base:
            new["partial_rotary_factor"] = base["partial_rotary_factor"]
        if new["rope_type"] in ("yarn", "llama3") and "original_max_position_embeddings" not in new:
            new["original_max_position_embeddings"] = int(text.max_position_embeddings)
        text.rope_parameters = {**params, "full_attention": new} if per_type else new
        notes.append(f"rope parameters{' (full_attention layers)' if per_type else ''}: {base} -> {new}")
    if max_position is not None:
        max_position = check_max_position(max_position)
        notes.append(f"max_position_embeddings: {text.max_position_embeddings} -> {int(max_position)}")
        text.max_position_embeddings = int(max_position)
    return notes


@dataclass(frozen=True)
class Placement:
    """A resolved model placement (what :func:`relaylens.model.loading.load_model` was asked for), for manifests.

    Attributes:
        device: resolved device (``None`` with a device map).
        dtype: ``float32`` / ``bfloat16`` / ``float16``.
        device_map: accelerate device map (``"auto"``) or None.
        attn_implementation: kernel the model loads with (the prefill's kernel).
        rope_scaling: rotary override applied to the config before loading, or None.
        max_position: ``max_position_embeddings`` override, or None.
        dtype_reason: for ``--dtype auto``, what was chosen and why (``"auto: bfloat16, CPU reports AVX512-BF16"``);
            None for an explicit dtype.
        decode_dtype: the dtype the decoding steps' linear layers compute in where ``--dtype auto`` measured it
            faster than ``dtype`` on this CPU (:func:`choose_dtypes`); None: ``dtype`` (left out of
            :meth:`to_dict` then, so manifests written before it existed stay equal).
    """

    device: str | None = "cpu"
    dtype: str = "float32"
    device_map: str | None = None
    attn_implementation: str = "sdpa"
    rope_scaling: dict | None = None
    max_position: int | None = None
    dtype_reason: str | None = None
    decode_dtype: str | None = None

    @classmethod
    def resolve(cls, device: str | None = None, dtype: str | torch.dtype | None = None, device_map: str | None = None,
                attn_implementation: str | None = None, rope_scaling: str | dict | None = None,
                max_position: int | None = None, local_rank: int | None = None) -> "Placement":
        """Resolve CLI-style options. ``device_map`` and an explicit ``device`` are exclusive.

        >>> Placement.resolve("cpu", "bf16", rope_scaling="yarn:4").dtype
        'bfloat16'
        """
        if device_map is not None and device not in (None, "auto"):
            raise PlacementError(f"pass either --device ({device}) or --device-map ({device_map}), not both")
        where = None if device_map is not None else resolve_device(device or "cpu", local_rank)
        chosen, decode, reason = choose_dtypes(dtype, where or ("cuda" if torch.cuda.is_available() else "cpu"))
        names = {v: k for k, v in DTYPES.items()}
        return cls(where, names[chosen], device_map, check_attn_implementation(attn_implementation, where),
                   parse_rope_scaling(rope_scaling), None if max_position is None else check_max_position(max_position),
                   reason, None if decode is None else names[decode])

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def load_kwargs(self) -> dict:
        """Keyword arguments of :func:`relaylens.model.loading.load_model`."""
        decode = {} if self.decode_dtype is None else {"decode_dtype": DTYPES[self.decode_dtype]}
        return dict(dtype=self.torch_dtype, device=self.device, device_map=self.device_map,
                    attn_implementation=self.attn_implementation, rope_scaling=self.rope_scaling,
                    max_position=self.max_position) | decode

    def to_dict(self) -> dict:
        recorded = asdict(self)
        if recorded["decode_dtype"] is None:
            del recorded["decode_dtype"]
        return recorded
