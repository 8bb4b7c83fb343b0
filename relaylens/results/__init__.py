"""The results stage: table schemas, the resumable run store and its manifest, shards and merge, atomic writes,
locks and stored token views. No torch.

Owns: :mod:`~relaylens.results.tables` (the long-format schemas of ``answers`` / ``scores`` / ``probes``),
:mod:`~relaylens.results.store` (:class:`RunStore`: units committed atomically, resumed after a kill, consolidated
into parquet), :mod:`~relaylens.results.manifest` (:func:`build_manifest`: what produced a run; comparing two
manifests), :mod:`~relaylens.results.shards` (record shards and merging them),
:mod:`~relaylens.results.atomic` (the atomic writer), :mod:`~relaylens.results.locks` (one writer per run
directory; both built on :mod:`relaylens.fileio`), :mod:`~relaylens.results.passes` (judge passes: shown once
complete) and :mod:`~relaylens.results.views` (the token views a run stores).

In: rows from the runner (and from re-judging). Out: a run directory and the tables read back from it.

May import: :mod:`relaylens.errors` and :mod:`relaylens.fileio` (atomic writes, lock files) only; importing this
package imports no torch.

Exports the stage contract: :class:`RunStore`, :func:`build_manifest` and :func:`load_tables` (a run directory's
tables read back). The other names of the former module ``relaylens.results`` (now in :mod:`relaylens.results.store`,
:mod:`relaylens.results.manifest` and :mod:`relaylens.fileio`) still resolve here, with a warning, until relaylens
0.3.0 (:data:`relaylens.MOVED_NAMES`).
"""

from relaylens import moved_name
from relaylens.results.manifest import build_manifest
from relaylens.results.store import RunStore, load_tables

__all__ = ["RunStore", "build_manifest", "load_tables"]


def __getattr__(name: str):  # names of the flat module this package replaced, until relaylens.REMOVED_IN
    return moved_name(__name__, name)
