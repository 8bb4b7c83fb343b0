"""Record order of a run: the file's, or interleaved over question types so that any prefix is a stratified sample.

Runs process records in plan order and resume where they stopped, and ``--limit N`` takes the first N. Real files are
often sorted by type (LongMemEval's oracle lists its 133 temporal-reasoning questions first), so a partial run or a
``--limit`` over file order measures one type only. ``interleave`` deals the records round-robin over their
``question_type`` (types in order of first appearance, file order within a type): every prefix holds each type in
proportion until the smaller types run out.

Example:
    >>> from types import SimpleNamespace as R
    >>> records = [R(record_id=i, question_type=t) for i, t in enumerate("aaabbc")]
    >>> [r.record_id for r in order_records(records, "interleave")]
    [0, 3, 5, 1, 4, 2]
    >>> [r.record_id for r in order_records(records, "file")]
    [0, 1, 2, 3, 4, 5]
"""

from __future__ import annotations

from itertools import zip_longest
from typing import Sequence, TypeVar

from relaylens.errors import RelaylensError

RECORD_ORDERS = ("file", "interleave")

T = TypeVar("T")


def check_record_order(order: str) -> str:
    """``order`` when it is one of :data:`RECORD_ORDERS`; else a :class:`RelaylensError` naming the choices."""
    if order not in RECORD_ORDERS:
        raise RelaylensError(f"record order must be one of {', '.join(RECORD_ORDERS)}; got {order!r}. Fix: pass "
                             "--record-order file (the file's order) or --record-order interleave (round-robin over "
                             "question types)")
    return order


def order_records(records: Sequence[T], order: str = "file") -> list[T]:
    """``records`` in run order: ``file`` keeps them; ``interleave`` deals them round-robin over question types."""
    check_record_order(order)
    if order == "file":
        return list(records)
    by_type: dict[str, list[T]] = {}
    for record in records:
        by_type.setdefault(str(record.question_type), []).append(record)
    return [r for row in zip_longest(*by_type.values()) for r in row if r is not None]
