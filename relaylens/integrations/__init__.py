"""Integrations: RoPERelay and every coordinate condition inside the tools researchers already use, checked against
relaylens's own decoding.

Owns: :mod:`~relaylens.integrations.hf_generate` (Hugging Face ``model.generate()`` over a relocated cache with
explicit positions: :func:`relay_generate`, and :func:`relay_inputs` for a ``generate()`` call of your own) and
:mod:`~relaylens.integrations.lm_eval` (the lm-evaluation-harness model type ``relaylens``: ``generate_until`` and
``loglikelihood`` with each request's context compressed by a selector and answered under a condition; it needs the
``lmeval`` extra and is imported on its own, never from here), :mod:`~relaylens.integrations.kvpress_relay`
(``RelayPress``, a kvpress press: it keeps what the wrapped press keeps and right-aligns it; self-contained, it imports
only torch and kvpress and runs in kvpress's own pinned environment, never imported from here) and
:mod:`~relaylens.integrations.tl_export` (one record under one condition as TransformerLens's ``ActivationCache`` and a
CircuitsVis-ready export of the final question token's attention over the relocated history; imported on its own).

In: a Hugging Face causal LM with rotary embeddings, its tokenizer, a history and a question (or lm-eval requests),
a selector, a budget and a condition. Out: generated text (``generate()``'s own output through
:func:`relay_inputs`), lm-eval loglikelihoods and generations. Axes: :mod:`relaylens.geometry`.

May import: :mod:`relaylens.errors`, :mod:`relaylens.datasets`, :mod:`relaylens.model`, :mod:`relaylens.geometry`,
:mod:`relaylens.conditions`, :mod:`relaylens.selectors`, :mod:`relaylens.generation`, :mod:`relaylens.probes` (the
stages below; it sits on the top floor beside :mod:`relaylens.experiments` and imports neither experiments, bench nor
the CLI). Outside packages (transformers' ``generate``, lm-eval, kvpress, TransformerLens) are used through their
public API and imported only by the module that needs them; transformers internals stay in :mod:`relaylens.model.hf`
(except in ``kvpress_relay``, which must run on kvpress's pinned transformers without relaylens).

Example:
    >>> generation_condition("relay").label
    'relay'
"""

from relaylens.integrations.hf_generate import (
                                                RelayInputs,
                                                condition_shift,
                                                generation_condition,
                                                relay_generate,
                                                relay_inputs,
                                                require_rotary,
                                                select_history,
)

__all__ = ["RelayInputs", "condition_shift", "generation_condition", "relay_generate", "relay_inputs", "require_rotary",
           "select_history"]
