"""Fused CPU relocation: one pass over the keys, as cheap as a copy (the fast path of ``geometry.relocate_keys``).

Eager PyTorch needs about a dozen passes per chunk of slots to relocate keys (gather four phase rows, combine them
into one relative rotation, rotate both halves of every plane, check finiteness), each pass streaming ``[slot, plane]``
buffers through the cache and paying a per-operator cost; on a SmolLM2-sized cache that is about 20x a float32 copy.
This kernel (compiled by numba once per plane layout and plane count, cached on disk) reads each key once, reads two
phase rows (``[cos | sin]`` at ``p'`` and the inverse phase at ``p``, from tables laid out so that each row is one
contiguous read), writes the relocated key once and sums ``0 * output`` (0 when every entry is finite, NaN otherwise),
so one flag says whether anything became NaN/inf. It is used for contiguous float32 CPU keys without
autograd; every other case (CUDA, bfloat16/float16, float64, autograd) keeps the eager path in ``geometry``.

The arithmetic is the eager path's: ``cos = c' * c_inv - s' * s_inv`` and ``sin = c' * s_inv + s' * c_inv`` (the phase
at ``p'`` times the exact inverse phase at ``p``) and ``(x_1 cos - x_2 sin, x_1 sin + x_2 cos)`` per plane, in float32;
slots with ``p' == p`` are copied bit for bit. Results agree with the eager path to float32 rounding (not bit for bit:
the order of the float32 operations differs) and are checked against transformers' own rotation in the tests.

``RELAYLENS_NO_FUSED=1`` (or numba missing) turns the kernel off; :func:`fused_available` says which path runs.

Example:
    >>> import torch
    >>> from relaylens.geometry import RotaryFactors, relocate_keys
    >>> from relaylens.testing import tiny_model
    >>> factors = RotaryFactors.from_model(tiny_model("llama"))
    >>> keys = torch.randn(2, 5, 16)                                  # [kv_head, n, head_dim]
    >>> src = torch.tensor([[0, 3, 9, 10, 40]] * 2)                    # [kv_head, n]
    >>> fused = relocate_keys(keys, src, src + 7, factors)           # the fused kernel when available
    >>> with disabled():
    ...     eager = relocate_keys(keys, src, src + 7, factors)
    >>> bool((fused - eager).abs().max() < 1e-6)
    True
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch

_KERNEL = None  # the kernel factory once numba is found (kernels compile per layout and plane count); False without numba
_LOCK = threading.Lock()
_STATE = threading.local()


def fused_available() -> bool:
    """Whether the fused kernel runs (numba importable and not disabled by ``RELAYLENS_NO_FUSED=1``/:func:`disabled`)."""
    if os.environ.get("RELAYLENS_NO_FUSED", "") not in ("", "0") or getattr(_STATE, "disabled", False):
        return False
    return _kernel() is not False


@contextlib.contextmanager
def disabled():
    """Run relocation on the eager path inside this block (this thread only); used to compare the two paths."""
    before = getattr(_STATE, "disabled", False)
    _STATE.disabled = True
    try:
        yield
    finally:
        _STATE.disabled = before


def usable(keys: torch.Tensor, rotary_dim: int) -> bool:
    """Whether ``keys`` can go through the fused kernel: float32, CPU, no autograd graph, an even rotary width."""
    return (keys.device.type == "cpu" and keys.dtype == torch.float32 and not keys.requires_grad
            and rotary_dim % 2 == 0 and fused_available())


def relocate_rows(flat_keys: torch.Tensor, source: torch.Tensor, target: torch.Tensor,
                  tables: tuple[torch.Tensor, torch.Tensor], rotary_dim: int, split_half: bool) -> tuple[torch.Tensor, bool]:
    """Relocate ``flat_keys`` ``[slots, head_dim]`` from ``source`` to ``target`` ``[slots]`` (int64 positions).

    ``tables`` are ``(forward, inverse)`` float32 ``[P, 2 * plane]``: ``[c | s]`` and ``[c / a^2 | -s / a^2]`` per
    position (``RotaryFactors.paired_phase_tables``). Returns the relocated keys ``[slots, head_dim]`` and whether every
    output entry is finite. Large inputs run on up to ``torch.get_num_threads()`` threads, the calling thread among
    them, each claiming chunks of ``CHUNK_SLOTS`` rows until none is left (the kernel releases the GIL): a thread whose
    core is still busy — e.g. with PyTorch's own workers spinning after an operation — simply does less, and the call
    waits only for chunks a helper has taken, never for a helper that has not started yet.
    """
    kernel = _kernel()(split_half, rotary_dim // 2)
    keys = flat_keys.contiguous().numpy()  # [slots, head_dim]
    out = torch.empty(flat_keys.shape, dtype=flat_keys.dtype)
    result = out.numpy()
    src, dst = source.contiguous().numpy(), target.contiguous().numpy()  # [slots] int64
    forward, inverse = (t.contiguous().numpy() for t in tables)  # [P, 2 * plane] each
    slots = keys.shape[0]
    if src.shape != (slots,) or dst.shape != (slots,):  # the kernel does not check its indices
        raise ValueError(f"relocate_rows needs one source and one target position per key row ({slots}); got "
                         f"{tuple(source.shape)} and {tuple(target.shape)}")
    threads = max(1, min(torch.get_num_threads(), slots // PARALLEL_SLOTS))
    step = CHUNK_SLOTS if threads > 1 else max(slots, 1)  # one thread: the whole input in one call
    claims = _Claims(slots, step)
    poison, errors = [], []

    def drain() -> None:
        while (start := claims.claim()) is not None:
            rows = slice(start, start + step)
            try:
                poison.append(kernel(keys[rows], src[rows], dst[rows], forward, inverse, result[rows]))
            except BaseException as error:  # raised again by the calling thread (nobody waits on a helper's future)
                errors.append(error)
            finally:
                claims.done()

    if threads > 1:
        pool = _pool(threads - 1)
        for _ in range(threads - 1):
            pool.submit(drain)
    drain()  # the calling thread works too, so a helper that starts late (its core busy) only takes fewer chunks
    claims.wait()  # for chunks helpers took, never for a helper that has not started (it will find nothing left)
    if errors:
        raise errors[0]
    return out, all(p == 0.0 for p in poison)


class _Claims:
    """Chunks ``[start, start + step)`` of ``slots`` rows handed out in turn, and a count of the ones in progress."""

    def __init__(self, slots: int, step: int) -> None:
        self._next, self._slots, self._step, self._busy = 0, slots, step, 0
        self._cond = threading.Condition()

    def claim(self) -> int | None:
        with self._cond:
            if self._next >= self._slots:
                return None
            start, self._next, self._busy = self._next, self._next + self._step, self._busy + 1
            return start

    def done(self) -> None:
        with self._cond:
            self._busy -= 1
            if not self._busy:
                self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._busy)


PARALLEL_SLOTS = 8192  # fewer slots per thread than this: one thread (starting threads would cost more than they save)
CHUNK_SLOTS = 4096  # the unit of work threads claim: small enough to balance, large enough that a call's cost vanishes
_POOLS: dict = {}
_KERNELS: dict = {}


def _pool(workers: int):
    from concurrent.futures import ThreadPoolExecutor

    key = (os.getpid(), workers)  # a forked child gets its own pool (the parent's worker threads do not survive a fork)
    with _LOCK:
        if key not in _POOLS:
            _POOLS[key] = ThreadPoolExecutor(workers, thread_name_prefix="relaylens-relocate")
        return _POOLS[key]


def _kernel():
    """The kernel factory ``(split_half, planes) -> kernel``, or False when numba is unavailable."""
    global _KERNEL
    if _KERNEL is None:
        with _LOCK:
            if _KERNEL is None:
                try:
                    import numba  # noqa: F401
                except ImportError:  # the eager path stays correct, only slower
                    _KERNEL = False
                else:
                    _KERNEL = _specialised
    return _KERNEL


def _specialised(split_half: bool, planes: int):
    """The kernel for one plane layout and plane count, compiled on first use (numba caches it on disk, keyed by
    these constants): a constant trip count lets the plane loop vectorise without run-time checks."""
    key = (bool(split_half), int(planes))
    kernel = _KERNELS.get(key)
    if kernel is None:
        with _LOCK:
            kernel = _KERNELS.get(key)
            if kernel is None:
                kernel = _KERNELS[key] = _compile(*key)
    return kernel


def _compile(split_half: bool, planes: int):
    """The kernel for one plane layout and plane count (compile-time constants of the closure)."""
    import numba
    import numpy as np

    zero = np.float32(0.0)
    rotary_dim = 2 * planes

    @numba.njit(cache=True, nogil=True, boundscheck=False, fastmath={"reassoc"})
    def relocate(keys, source, target, forward, inverse, out):  # pragma: no cover
        # ``reassoc`` only lets the poison sum below vectorise: no product is contracted or reordered, and NaN/inf
        # still propagate (x * 0 is NaN for x = inf or NaN, 0 otherwise), so ``poison`` is 0 iff every output is finite
        slots, head_dim = keys.shape
        poison = zero
        for row in range(slots):
            src = source[row]
            dst = target[row]
            key = keys[row]  # [head_dim]
            result = out[row]
            if src == dst:  # stays put: an identity, bit for bit
                for j in range(head_dim):
                    result[j] = key[j]
                    poison += key[j] * zero
                continue
            to = forward[dst]  # [2 * plane]: cos | sin at p'
            back = inverse[src]  # [2 * plane]: cos | sin of the exact inverse phase at p
            for j in range(planes):
                first = j if split_half else 2 * j  # a plane's two features: (j, j + planes) or (2j, 2j + 1)
                second = j + planes if split_half else 2 * j + 1
                to_c = to[j]
                to_s = to[j + planes]
                from_c = back[j]
                from_s = back[j + planes]
                c = to_c * from_c - to_s * from_s  # one rotation from p to p' (float32)
                s = to_c * from_s + to_s * from_c
                x1 = key[first]
                x2 = key[second]
                y1 = x1 * c - x2 * s
                y2 = x1 * s + x2 * c
                result[first] = y1
                result[second] = y2
                poison += y1 * zero + y2 * zero
            for j in range(rotary_dim, head_dim):  # pass-through features, bit for bit
                result[j] = key[j]
                poison += key[j] * zero
        return poison

    return relocate
