"""Fused CPU relocation: one pass over the keys, as cheap as a copy (the fast path of ``geometry.relocate_keys``).

Eager PyTorch needs about a dozen passes per chunk of slots to relocate keys (gather four phase rows, combine them
into one relative rotation, rotate both halves of every plane, check finiteness), each pass streaming ``[slot, plane]``
buffers through the cache and paying a per-operator cost; on a SmolLM2-sized cache that is about 20x a float32 copy.
This kernel (:mod:`relaylens.geometry.numba_source`, compiled by numba once per plane layout and plane count, cached on
disk) reads each key once, reads two phase rows (``[cos | sin]`` at ``p'`` and the inverse phase at ``p``, from tables
laid out so that each row is one contiguous read), writes the relocated key once and sums ``0 * output`` (0 when every
entry is finite, NaN otherwise), so one flag says whether anything became NaN/inf. It also checks every position against
the tables as it goes, so a call makes no separate pass over the positions. It is used for float32 and bfloat16 CPU keys
without autograd (bfloat16 keys are widened to float32 feature by feature as they are read and rounded back to nearest
even as they are written: the paper's "relocate in float32, cast back" in one pass over half the bytes); every other
case (CUDA, float16, float64, autograd) keeps the eager path in ``geometry``.

The arithmetic is the eager path's: ``cos = c' * c_inv - s' * s_inv`` and ``sin = c' * s_inv + s' * c_inv`` (the phase
at ``p'`` times the exact inverse phase at ``p``) and ``(x_1 cos - x_2 sin, x_1 sin + x_2 cos)`` per plane, in float32,
with fused multiply-adds (one rounding for a product and a sum) where the CPU has them; slots with ``p' == p`` are
copied bit for bit. Results agree with the eager path to float32 rounding (not bit for bit: FMA and the order of the
float32 operations differ) and are checked against transformers' own rotation in the tests.

Threads: a large call runs on PyTorch's own OpenMP team when PyTorch uses GNU OpenMP (its Linux wheels), through the
runtime's ``GOMP_parallel`` entry point — the team PyTorch's operations run on, whose workers keep spinning for a while
after each operation, so they start at once (a separate thread pool would have to wait for those cores). Elsewhere a
small Python thread pool runs the same work (:func:`parallel_backend`; ``RELAYLENS_NO_OPENMP=1`` forces it).

``RELAYLENS_NO_FUSED=1`` (or numba missing) turns the kernel off; :func:`fused_available` says which path runs.

Example:
    >>> import torch
    >>> from relaylens.geometry.rotary import RotaryFactors, relocate_keys
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
import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from relaylens import moved_name
from relaylens.errors import ShapeError

# the kernel factory once numba is found (kernels compile per layout and plane count); False without numba
_KERNEL_FACTORY = None
_LOCK = threading.Lock()
_STATE = threading.local()


def fused_available() -> bool:
    """Whether the fused kernel runs (numba importable and not disabled by ``RELAYLENS_NO_FUSED=1`` /
    :func:`disabled`)."""
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


KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def usable(keys: torch.Tensor, rotary_dim: int) -> bool:
    """Whether ``keys`` can go through the fused kernel: float32 or bfloat16, CPU, no autograd graph, an even rotary
    width."""
    return (keys.device.type == "cpu" and keys.dtype in KERNEL_DTYPES and not keys.requires_grad
            and rotary_dim % 2 == 0 and fused_available())


def relocate_key_rows(flat_keys: torch.Tensor, source: torch.Tensor, target: torch.Tensor,
                  tables: tuple[torch.Tensor, torch.Tensor], rotary_dim: int,
                  split_half: bool) -> tuple[torch.Tensor, bool, bool]:
    """Relocate ``flat_keys`` ``[slots, head_dim]`` from ``source`` to ``target`` ``[slots]`` (int64 positions).

    ``tables`` are ``(forward, inverse)`` float32 ``[P, 2 * plane]``: ``[c | s]`` and ``[c / a^2 | -s / a^2]`` per
    position (``RotaryFactors.paired_phase_tables``). Returns the relocated keys ``[slots, head_dim]``, whether every
    output entry is finite, and whether every position was in ``[0, P)``. Rows with a position outside are left
    unwritten (the kernel checks its indices as it goes, so no separate pass over the positions is needed): the caller
    then checks the positions (and raises) or grows the tables and calls again.

    Inputs of at least ``2 * PARALLEL_SLOTS`` rows run on up to ``torch.get_num_threads()`` threads (one per
    ``PARALLEL_SLOTS`` rows), each claiming blocks of rows until none is left. The team is PyTorch's own OpenMP team
    when PyTorch runs on GNU OpenMP (Linux wheels): right after a PyTorch operation its workers are still spinning, so
    they start at once instead of competing with a separate pool for the cores (:func:`parallel_backend`). Otherwise a
    small Python thread pool runs the same blocks; the call then waits only for chunks a helper has taken, never for a
    helper that has not started (its core busy), and an error in any chunk is raised by the caller.
    """
    bfloat16 = flat_keys.dtype == torch.bfloat16
    kernel = _kernel()(split_half, rotary_dim // 2, bfloat16)
    out = torch.empty(flat_keys.shape, dtype=flat_keys.dtype)
    if bfloat16:  # numpy has no bfloat16: the kernel reads and writes the bit patterns
        keys = flat_keys.contiguous().view(torch.int16).numpy().view(np.uint16)  # [slots, head_dim]
        result = out.view(torch.int16).numpy().view(np.uint16)
    else:
        keys = flat_keys.contiguous().numpy()  # [slots, head_dim]
        result = out.numpy()
    src, dst = source.contiguous().numpy(), target.contiguous().numpy()  # [slots] int64
    forward, inverse = (t.contiguous().numpy() for t in tables)  # [P, 2 * plane] each
    slots = keys.shape[0]
    if src.shape != (slots,) or dst.shape != (slots,) or src.dtype != np.int64 or dst.dtype != np.int64:
        raise ShapeError("relocate_key_rows needs one int64 source and one int64 target position per key row "
                         f"({slots}); got {tuple(source.shape)} {source.dtype} and {tuple(target.shape)} "
                         f"{target.dtype}. Fix: pass source and target as int64 tensors of shape [slots]")
    if (forward.shape != inverse.shape or forward.shape[1] != rotary_dim or keys.shape[1] < rotary_dim
            or keys.dtype != (np.uint16 if bfloat16 else np.float32)
            or not forward.dtype == inverse.dtype == np.float32):  # the OpenMP entry reads raw memory
        raise ShapeError(f"relocate_key_rows needs float32 or bfloat16 keys [slots, >= {rotary_dim}] and float32 phase "
                         f"tables [P, {rotary_dim}]; got keys {keys.shape} {keys.dtype}, tables {forward.shape} "
                         f"{forward.dtype} / {inverse.shape} {inverse.dtype}. Fix: pass keys of those shapes and the "
                         "float32 phase tables of the same rotary_dim")
    threads = max(1, min(torch.get_num_threads(), slots // PARALLEL_SLOTS))
    if threads == 1:  # small inputs: one call on this thread (starting a team would cost more than it saves)
        poison, outside = kernel.rows(keys, src, dst, forward, inverse, result, 0, slots)
        return out, poison == 0.0, not outside
    team = _openmp()
    if team is not None:
        return (out, *kernel.run_team(team.GOMP_parallel, keys, src, dst, forward, inverse, result, threads,
                                      max(1, BLOCK_FEATURES // keys.shape[1])))
    return (out, *_python_pool(kernel.rows, keys, src, dst, forward, inverse, result, threads))




def parallel_backend() -> str:
    """Which threads run large relocations: ``"openmp"`` (PyTorch's own GNU OpenMP team) or ``"python"`` (a Python
    thread pool: other platforms, or ``RELAYLENS_NO_OPENMP=1``)."""
    return "openmp" if _openmp() is not None else "python"


def _python_pool(rows, keys, src, dst, forward, inverse, result, threads: int) -> tuple[bool, bool]:
    """The Python thread pool's run: chunks of ``CHUNK_SLOTS`` rows claimed in turn; returns whether all output is
    finite and whether every position was inside the tables."""
    claims = _Claims(keys.shape[0], CHUNK_SLOTS)
    results, errors = [], []

    def drain() -> None:
        while (start := claims.claim()) is not None:
            try:
                results.append(rows(keys, src, dst, forward, inverse, result, start,
                                    min(start + CHUNK_SLOTS, keys.shape[0])))
            except BaseException as error:  # raised again by the calling thread (nobody waits on a helper's future)
                errors.append(error)
            finally:
                claims.done()

    pool = _pool(threads - 1)
    for _ in range(threads - 1):
        pool.submit(drain)
    drain()  # the calling thread works too, so a helper that starts late (its core busy) only takes fewer chunks
    claims.wait()  # for chunks helpers took, never for a helper that has not started (it will find nothing left)
    if errors:
        raise errors[0]
    return all(poison == 0.0 for poison, _ in results), not any(outside for _, outside in results)


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
CHUNK_SLOTS = 4096  # the Python pool's unit of work: small enough to balance, large enough that a call's cost vanishes
# the OpenMP team's unit of work, in key features (1,024 rows of head_dim 64): 36 blocks on a SmolLM2 cache
BLOCK_FEATURES = 65536
_OPENMP = None  # PyTorch's OpenMP runtime (a ctypes handle) once looked up; False when there is none to use
_FORKED = False  # True in a process forked from the one that imported this module
_POOLS: dict = {}
_COMPILED_KERNELS: dict = {}


def _pool(workers: int):
    key = (os.getpid(), workers)  # a forked child gets its own pool (the parent's worker threads do not survive a fork)
    with _LOCK:
        if key not in _POOLS:
            _POOLS[key] = ThreadPoolExecutor(workers, thread_name_prefix="relaylens-relocate")
        return _POOLS[key]


def _kernel():
    """The kernel factory ``(split_half, planes) -> fused_kernel.Kernel``, or False when numba is unavailable."""
    global _KERNEL_FACTORY
    if _KERNEL_FACTORY is None:
        with _LOCK:
            if _KERNEL_FACTORY is None:
                try:
                    import numba  # noqa: F401, PLC0415 - optional: numba is probed inside try/except ImportError
                except ImportError:  # the eager path stays correct, only slower
                    _KERNEL_FACTORY = False
                else:
                    _KERNEL_FACTORY = _specialised
    return _KERNEL_FACTORY


def _specialised(split_half: bool, planes: int, bfloat16: bool = False):
    """The kernel for one plane layout, plane count and key dtype, compiled on first use (numba caches it on disk,
    keyed by these constants)."""
    key = (bool(split_half), int(planes), bool(bfloat16))
    kernel = _COMPILED_KERNELS.get(key)
    if kernel is None:
        with _LOCK:
            kernel = _COMPILED_KERNELS.get(key)
            if kernel is None:
                from relaylens.geometry.numba_source import compile_kernel  # noqa: PLC0415 - import cost: numba and llvmlite load on first use (the fused kernel is optional)

                kernel = _COMPILED_KERNELS[key] = compile_kernel(*key)
    return kernel


def _openmp():
    """PyTorch's GNU OpenMP runtime as a ctypes handle, or None (not found, a forked child, or
    ``RELAYLENS_NO_OPENMP=1``)."""
    global _OPENMP
    if _FORKED or os.environ.get("RELAYLENS_NO_OPENMP", "") not in ("", "0"):
        return None
    if _OPENMP is None:
        with _LOCK:
            if _OPENMP is None:
                _OPENMP = _find_openmp() or False
    return _OPENMP or None


def _forked() -> None:
    global _FORKED
    _FORKED = True


if hasattr(os, "register_at_fork"):  # a GNU OpenMP team does not survive a fork: a child uses the Python pool
    os.register_at_fork(after_in_child=_forked)


def _find_openmp():
    """The GNU OpenMP library PyTorch ships and this process has loaded (``torch/lib`` or the wheel's
    ``torch.libs``), exporting ``GOMP_parallel`` (what GCC compiles ``#pragma omp parallel`` to); None otherwise
    (non-Linux, a PyTorch on another threading runtime, or one linked against the system's libgomp)."""
    if not getattr(torch._C, "has_openmp", False):
        return None
    package = os.path.realpath(os.path.dirname(torch.__file__))
    roots = tuple(root + os.sep for root in (package, package + ".libs"))
    try:
        with open("/proc/self/maps") as maps:
            loaded = sorted({line.split()[-1] for line in maps if "/libgomp" in line})  # [address ... path] per mapping
    except OSError:
        return None
    for path in loaded:
        if not os.path.realpath(path).startswith(roots):
            continue
        try:
            library = ctypes.CDLL(path)  # already loaded: the same handle PyTorch uses
            parallel = library.GOMP_parallel
        except (OSError, AttributeError):
            continue
        parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        parallel.restype = None
        return library
    return None


def __getattr__(name: str):  # old names of this module (relaylens.MOVED_NAMES), until relaylens.REMOVED_IN
    return moved_name(__name__, name)
