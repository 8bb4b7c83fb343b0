"""The results stage: table schemas, the resumable run store and its manifest, shards and merge, atomic writes,
locks and stored token views. No torch.

Owns: :mod:`~relaylens.results.tables` (the long-format schemas of ``answers`` / ``scores`` / ``probes``),
:mod:`~relaylens.results.store` (:class:`RunStore`: units committed atomically, resumed after a kill, consolidated
into parquet; :func:`build_manifest`), :mod:`~relaylens.results.shards` (record shards and merging them),
:mod:`~relaylens.results.atomic` (the atomic writer), :mod:`~relaylens.results.locks` (one writer per run
directory; both built on :mod:`relaylens.fileio`), :mod:`~relaylens.results.passes` (judge passes: shown once
complete) and :mod:`~relaylens.results.views` (the token views a run stores).

In: rows from the runner (and from re-judging). Out: a run directory and the tables read back from it.

May import: :mod:`relaylens.errors` and :mod:`relaylens.fileio` (atomic writes, lock files) only; importing this
package imports no torch.

The former module ``relaylens.results`` is now :mod:`relaylens.results.store`; its names are importable from here.
"""

from relaylens.results.store import (FORMAT_VERSION, UNITS, ResultStoreError, RunStore, StoreWriteError, UnitKey,
                                     build_manifest, file_sha256, load_run, load_tables, manifest_diff, manifest_section,
                                     prepare_run_dir, source_state)

__all__ = ["FORMAT_VERSION", "UNITS", "ResultStoreError", "RunStore", "StoreWriteError", "UnitKey", "build_manifest",
           "file_sha256", "load_run", "load_tables", "manifest_diff", "manifest_section", "prepare_run_dir", "source_state"]
