"""The numba code of the fused relocation kernel (imported only when numba is; :mod:`relaylens.geometry.fused`
dispatches).

Two entry points per plane layout and plane count, both running the same row loop (:func:`compile_kernel`):

- ``rows(keys, source, target, forward, inverse, out, start, stop)``: rows ``[start, stop)`` of C-contiguous
  ``keys``/``out`` ``[slots, head_dim]`` float32, int64 ``source``/``target`` ``[slots]``, tables ``[P, rotary_dim]``;
  returns ``(poison, outside)``: poison is 0 when every output entry is finite (NaN otherwise), ``outside`` counts the
  rows left unwritten because a position is not in ``[0, P)`` (the caller then checks the positions properly). Called
  from Python (one thread, or the Python pool's chunks).
- ``team``: a C callback ``void(int64 *params)`` run by every thread of an OpenMP team (``GOMP_parallel``;
  :meth:`Kernel.run_team` packs ``params``, the arrays' addresses and sizes); each thread claims blocks of rows
  with an atomic add on a shared counter until none is left, and records non-finite output and positions outside
  the tables in the shared state ``[next row, non-finite, outside]``.

Indices are unsigned in the row loop: numba then adds no negative-index wraparound, which would stop LLVM from
vectorising the plane loop.

bfloat16 keys (``keys``/``out`` as ``uint16`` bit patterns) run the same loop: each feature is widened to float32 as
it is read (the bit pattern shifted into the high half, exact), the arithmetic is the float32 kernel's, and each
result is rounded to nearest even as it is written (NaN -> 0x7FC0): exactly what ``torch``'s float32 -> bfloat16 cast
does, so a bfloat16 call equals the float32 kernel on the widened keys followed by ``.to(torch.bfloat16)``, bit for
bit, while reading and writing half the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload


@intrinsic
def _fetch_add(typingctx, array, index, value):
    """``array[index] += value`` as one atomic instruction; returns the value before (int64 arrays)."""
    signature = types.int64(array, types.intp, types.int64)

    def codegen(context, builder, sig, args):
        array_type = sig.args[0]
        data = context.make_array(array_type)(context, builder, args[0])
        pointer = cgutils.get_item_pointer(context, builder, array_type, data, [args[1]])
        return builder.atomic_rmw("add", pointer, args[2], "seq_cst")

    return signature, codegen


def _pointer(dtype):
    @intrinsic
    def cast(typingctx, address):
        """An int64 address read as a typed pointer (for ``numba.carray``)."""
        signature = types.CPointer(dtype)(types.int64)

        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

        return signature, codegen

    return cast


_float32_at = _pointer(types.float32)
_uint16_at = _pointer(types.uint16)
_int64_at = _pointer(types.int64)


@intrinsic
def _float_from_bits(typingctx, bits):
    """A uint32 bit pattern read as the float32 it encodes (no conversion)."""
    signature = types.float32(types.uint32)

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())

    return signature, codegen


@intrinsic
def _bits_of_float(typingctx, value):
    """The uint32 bit pattern of a float32 (no conversion)."""
    signature = types.uint32(types.float32)

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return signature, codegen


def _load(array, index):  # pragma: no cover - replaced by the overload below inside compiled code
    """Feature ``index`` of ``array`` as float32 (bfloat16 bit patterns widened exactly)."""


@overload(_load, inline="always")
def _load_overload(array, index):
    if array.dtype == types.uint16:
        return lambda array, index: _float_from_bits(numba.uint32(array[index]) << numba.uint32(16))
    return lambda array, index: array[index]


def _store(array, index, value):  # pragma: no cover - replaced by the overload below inside compiled code
    """Write float32 ``value`` into ``array`` (rounded to nearest even for bfloat16); return what was stored."""


@overload(_store, inline="always")
def _store_overload(array, index, value):
    if array.dtype == types.uint16:
        def store_bfloat16(array, index, value):
            bits = _bits_of_float(value)
            nearest = (bits + numba.uint32(0x7FFF) + ((bits >> numba.uint32(16)) & numba.uint32(1))) >> numba.uint32(16)
            nan = numba.uint32(value != value)  # NaN stays NaN (0x7FC0; the carry could have zeroed it), branch-free
            rounded = nearest + nan * (numba.uint32(0x7FC0) - nearest)  # modulo 2^32: 0x7FC0 when nan, else nearest
            array[index] = numba.uint16(rounded)
            return _float_from_bits(rounded << numba.uint32(16))

        return store_bfloat16

    def store_float32(array, index, value):
        array[index] = value
        return value

    return store_float32
PARAMS = 11  # keys, source, target, forward, inverse, out (addresses), slots, head_dim, table rows, block rows, state


@dataclass(frozen=True)
class Kernel:
    """The compiled entry points for one layout and plane count."""

    rows: Any  # numba dispatcher
    team: Any  # numba cfunc, held here so its address stays valid

    def run_team(self, parallel, keys, source, target, forward, inverse, out, threads: int,
                 block: int) -> tuple[bool, bool]:
        """Run ``team`` on ``threads`` threads through ``parallel`` (an OpenMP runtime's ``GOMP_parallel``), claiming
        ``block`` rows at a time; the arguments are ``rows``'s arrays. Returns whether every output entry is finite and
        whether every position was inside the tables (this packs ``params`` in the order ``team`` reads them)."""
        state = np.zeros(3, dtype=np.int64)  # [next row to claim, any non-finite output, rows outside the tables]
        params = np.array([keys.ctypes.data, source.ctypes.data, target.ctypes.data, forward.ctypes.data,
                           inverse.ctypes.data, out.ctypes.data, keys.shape[0], keys.shape[1], forward.shape[0], block,
                           state.ctypes.data], dtype=np.int64)
        assert params.shape == (PARAMS,)
        parallel(self.team.address, params.ctypes.data, threads, 0)  # returns when every thread is done
        return not state[1], not state[2]


@numba.njit(cache=True, nogil=True, boundscheck=False, fastmath={"reassoc", "contract"})
def _relocate_range(keys, source, target, forward, inverse, out, head_dim, table_rows, start, stop, planes,
                    split_half):  # pragma: no cover
    """Rows ``[start, stop)`` of flat 1-D arrays; ``planes`` and ``split_half`` are compile-time constants (literals).

    ``reassoc`` lets the poison sum vectorise and ``contract`` fuses a product and a sum into one rounding (FMA);
    NaN/inf still propagate (x * 0 is NaN for x = inf or NaN, 0 otherwise), so poison is 0 iff every output entry is
    finite.
    """
    numba.literally(planes)
    numba.literally(split_half)
    zero = np.float32(0.0)
    wide, half = numba.uint64(2 * planes), numba.uint64(planes)
    one, two = numba.uint64(1), numba.uint64(2)
    width = numba.uint64(head_dim)
    limit = numba.uint64(table_rows)
    poison = zero
    outside = 0
    for row in range(start, stop):
        src = numba.uint64(source[row])  # a negative position wraps to a huge one: outside the tables too
        dst = numba.uint64(target[row])
        if src >= limit or dst >= limit:  # left unwritten; the caller checks the positions and says what is wrong
            outside += 1
            continue
        base = numba.uint64(row) * width  # this key's first feature
        if src == dst:  # stays put: an identity, bit for bit
            for j in range(width):
                out[base + j] = keys[base + j]
                poison += _load(keys, base + j) * zero
            continue
        to = dst * wide  # the row [c | s] at p'
        back = src * wide  # the row [c | s] of the exact inverse phase at p
        for plane in range(planes):
            j = numba.uint64(plane)
            first = base + j if split_half else base + two * j  # a plane's features: (j, j + planes) or (2j, 2j + 1)
            second = base + j + half if split_half else base + two * j + one
            to_c = forward[to + j]
            to_s = forward[to + j + half]
            from_c = inverse[back + j]
            from_s = inverse[back + j + half]
            c = to_c * from_c - to_s * from_s  # one rotation from p to p' (float32)
            s = to_c * from_s + to_s * from_c
            x1 = _load(keys, first)
            x2 = _load(keys, second)
            y1 = _store(out, first, x1 * c - x2 * s)  # what was stored (rounded for bfloat16)
            y2 = _store(out, second, x1 * s + x2 * c)
            poison += y1 * zero + y2 * zero
        for j in range(wide, width):  # pass-through features, bit for bit
            out[base + j] = keys[base + j]
            poison += _load(keys, base + j) * zero
    return poison, outside


def compile_kernel(split_half: bool, planes: int, bfloat16: bool = False) -> Kernel:
    """Compile (or load from numba's disk cache) the kernel for one plane layout and plane count: compile-time
    constants, so the plane loop has a constant trip count and vectorises without run-time checks. ``bfloat16``:
    keys and output are ``uint16`` bfloat16 bit patterns (the tables stay float32)."""
    split_half, planes = bool(split_half), int(planes)
    rotary_dim = 2 * planes
    zero = np.float32(0.0)
    key_at = _uint16_at if bfloat16 else _float32_at  # keys and output: bfloat16 bit patterns or float32

    @numba.njit(cache=True, nogil=True, boundscheck=False)
    def rows(keys, source, target, forward, inverse, out, start, stop):  # pragma: no cover
        return _relocate_range(keys.ravel(), source, target, forward.ravel(), inverse.ravel(), out.ravel(),
                               keys.shape[1], forward.shape[0], start, stop, planes, split_half)

    @numba.cfunc(types.void(types.CPointer(types.int64)), cache=True, nopython=True, boundscheck=False)
    def team(params_at):  # pragma: no cover
        params = numba.carray(params_at, PARAMS)
        slots, head_dim, table_rows, block = params[6], params[7], params[8], params[9]
        keys = numba.carray(key_at(params[0]), slots * head_dim)
        source = numba.carray(_int64_at(params[1]), slots)
        target = numba.carray(_int64_at(params[2]), slots)
        forward = numba.carray(_float32_at(params[3]), table_rows * rotary_dim)
        inverse = numba.carray(_float32_at(params[4]), table_rows * rotary_dim)
        out = numba.carray(key_at(params[5]), slots * head_dim)
        state = numba.carray(_int64_at(params[10]), 3)  # [next row to claim, non-finite output, rows outside]
        while True:
            start = _fetch_add(state, 0, block)
            if start >= slots:
                break
            poison, outside = _relocate_range(keys, source, target, forward, inverse, out, head_dim, table_rows, start,
                                              min(start + block, slots), planes, split_half)
            if poison != zero:
                state[1] = 1  # read after the team's closing barrier
            if outside:
                _fetch_add(state, 2, outside)

    return Kernel(rows, team)
