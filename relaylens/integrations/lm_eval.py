"""The lm-evaluation-harness model type ``relaylens``: each request's context is compressed by a selector and the
request is answered under a coordinate condition (``generate_until`` and ``loglikelihood``).

A request's context (``C`` tokens, as the harness's ``hf`` model encodes it) is split into a history, its first
``C - question_tokens`` tokens, which is prefilled once and compressed by the selector at the budget, and a question,
its last ``question_tokens`` tokens, which runs at the condition's question start (``M`` for ``relay``) over the
relocated cache. ``loglikelihood`` scores the continuation teacher-forced right after the question
(:func:`relaylens.generation.rows.run_rows`); ``generate_until`` decodes with ``model.generate()`` through
:func:`relaylens.integrations.hf_generate.relay_inputs`, with the harness's own stop sequences and
generation arguments. Everything else (loading, tokenization, chat templates, stop handling, batching of
``generate_until``) is the harness's ``hf`` model (``HFLM``), which this class extends: with ``condition=original``
and ``budget=1.0`` it reproduces ``hf`` on the same requests (tests/integrations/test_lm_eval.py).

Registered at import with lm-eval's ``register_model``, and declared in the entry-point group ``lm_eval.models``
(``relaylens = "relaylens.integrations.lm_eval:RelaylensLM"``), which lm-eval loads from 0.4.14 on (its ``--plugins``
flag). lm-eval 0.4.13 loads no third-party model plugins (``--include_path`` adds tasks only), so there the plain
``lm_eval`` command cannot see it: run the harness's CLI through this module, which imports (and so registers) it
first::

    python -m relaylens.integrations.lm_eval --model relaylens \\
        --model_args pretrained=PATH,selector=snapkv,budget=0.1,condition=relay --tasks TASK

or ``relaylens-lm-eval`` (the same, installed as a script), or from Python ``import relaylens.integrations.lm_eval``
before ``lm_eval.simple_evaluate(model="relaylens", ...)``.

Model arguments beyond ``hf``'s: ``selector`` (a relaylens selector name), ``selector_<option>`` (its
hyperparameters, e.g. ``selector_window=8``), ``budget`` (a ratio such as ``0.1`` or ``1.0``, or states ``B64``: an
integer is a number of states), ``condition`` (``relay``, ``original``, ``query_only(2048)``, ...),
``question_tokens`` (16), ``too_short`` (``error``, the default, or ``keep``: a context too short for the
selector's window runs uncompressed, and the count is logged) and ``framing_tokens`` (0). ``pretrained`` may also
name a relaylens embedded model (``smollm2-135m-instruct``).

Framing regime: a harness context is plain text without the spans ``relaylens run`` protects, so by default the
framing competes for the budget (the *framing evicted* ablation, ``relaylens run --no-protect-instructions``);
``framing_tokens=N`` keeps each context's first ``N`` tokens (the task's instruction or chat-template head) outside
the budget, the paper's regime (:func:`relaylens.selectors.protection.select_protected`). The model info records it
(``relaylens_framing``), and a ``learned:RUN_DIR`` condition's content hash (``relaylens_learned_sha256``).

Refused in one line, before any model work: ``trust_remote_code`` and a model or tokenizer directory that declares
custom code (``auto_map``), as ``relaylens run`` refuses them, before anything loads; a selector that reads a
rendered prompt (``bm25``, ``finch``); a model without rotary embeddings; a probe-only condition; a learned geometry
fitted on another model or under other settings (the run's fit check); and a request whose positions pass the
model's rotary range (the harness's ``hf`` model would truncate it from the left). ``loglikelihood_rolling``
(perplexity tasks) is not supported.

Example:
    >>> from lm_eval.api.registry import get_model
    >>> get_model("relaylens") is RelaylensLM
    True
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.__main__ import cli_evaluate
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM, normalize_gen_kwargs, stop_sequences_criteria  # the helpers hf uses
from tqdm import tqdm
from transformers import AutoConfig

from relaylens.errors import BudgetError, ModelError, PositionError, RelaylensError, RopeError, TooShortError
from relaylens.generation.rows import Row, run_rows
from relaylens.integrations.hf_generate import (
    condition_shift,
    generation_condition,
    relay_inputs,
    require_rotary,
    select_history,
)
from relaylens.integrations.learned_use import check_learned_use
from relaylens.model.catalogue import EMBEDDED
from relaylens.model.loading import check_no_remote_code, remote_code_refusal
from relaylens.selectors import make_selector
from relaylens.selectors.base import Budget

__all__ = ["RelaylensLM", "main"]

log = logging.getLogger(__name__)
TOO_SHORT = ("error", "keep")


@register_model("relaylens")
class RelaylensLM(HFLM):
    """lm-eval's ``hf`` model with each request's context compressed and relocated (see the module docstring).

    Args:
        pretrained: a local path, a hub id, a relaylens embedded name or a loaded model (as for ``hf``).
        selector, budget, condition: what to keep and where the kept keys sit.
        question_tokens: the context's last tokens that run as the question over the compressed history.
        window_size: history queries the prefill captures (at least the selector's window).
        too_short: ``"error"`` or ``"keep"`` (a context too short for the selector runs uncompressed).
        kwargs: ``selector_<option>`` hyperparameters, then everything ``HFLM`` takes (``device``, ``dtype``, ...).
    """

    def __init__(self, pretrained, selector: str = "snapkv", budget=0.1, condition: str = "relay",
                 question_tokens: int = 16, window_size: int = 32, too_short: str = "error", framing_tokens: int = 0,
                 **kwargs) -> None:
        _refuse_remote_code(pretrained, kwargs)  # before anything loads, exactly as relaylens run
        options = {key[len("selector_"):]: kwargs.pop(key) for key in list(kwargs) if key.startswith("selector_")}
        self.relay_selector = make_selector(str(selector), **options)  # every argument checked before the model loads
        if getattr(self.relay_selector, "needs_prompt", False):
            raise RelaylensError(f"lm_eval --model relaylens: selector {self.relay_selector.name!r} reads a rendered "
                                 "relaylens prompt (question text, session spans), and a harness request is plain text "
                                 "without them. Fix: an attention-based selector (selector=snapkv, pyramidkv, adakv, "
                                 "h2o, ...)")
        self.relay_options = options
        self.relay_budget = Budget.coerce(budget)
        self.relay_condition = generation_condition(str(condition))
        if isinstance(framing_tokens, bool) or not isinstance(framing_tokens, int) or framing_tokens < 0:
            raise RelaylensError(f"framing_tokens must be a whole number >= 0 (each context's first tokens kept "
                                 f"outside the budget); got {framing_tokens!r}. Fix: e.g. framing_tokens=0 (framing "
                                 "evicted) or the length of the task's instruction")
        self.framing_tokens = framing_tokens
        if isinstance(question_tokens, bool) or not isinstance(question_tokens, int) or question_tokens < 1:
            raise RelaylensError(f"question_tokens must be a whole number >= 1 (the context's last tokens, run as the "
                                 f"question); got {question_tokens!r}. Fix: e.g. question_tokens=16")
        if too_short not in TOO_SHORT:
            raise RelaylensError(f"too_short must be one of {TOO_SHORT}; got {too_short!r}")
        self.question_tokens, self.window_size, self.too_short = question_tokens, int(window_size), too_short
        self.uncompressed = 0  # requests that ran uncompressed under too_short=keep
        if isinstance(pretrained, str):
            pretrained, kwargs = _embedded(pretrained, kwargs)
        if isinstance(pretrained, str):
            _check_config(pretrained, kwargs)  # a model without rotary embeddings is refused before its weights load
        super().__init__(pretrained=pretrained, **kwargs)
        if self.backend != "causal":
            raise RelaylensError(f"relaylens compresses the context of decoder-only models; {pretrained!r} loaded as "
                                 f"{self.backend}. Fix: use a causal LM (backend=causal)")
        self.factors = require_rotary(self.model, "lm_eval --model relaylens")
        self.relay_condition = generation_condition(self.relay_condition, self.model)  # scopes bind layer types
        self.learned_sha256 = check_learned_use(  # a learned geometry only where it was fitted, as relaylens run
            self.relay_condition, self.model, "lm_eval --model relaylens", selector=self.relay_selector,
            budget=self.relay_budget, selector_options=options, protect_instructions=framing_tokens > 0,
            window_mode="condition")
        self.shift = condition_shift(self.relay_condition)
        self._compressed: tuple | None = None  # (context ids, compression): consecutive requests share a context

    # ------------------------------------------------------------------------------------------ request checks
    def _check_range(self, lengths: list[int], kind: str) -> None:
        """Refuse (one line, before any model work) requests whose last position passes the rotary range."""
        limit = min(self.factors.position_limit, self.max_length)  # hf would truncate past its max_length
        worst = max(lengths, default=0) + self.shift
        if worst > limit:
            count = sum(length + self.shift > limit for length in lengths)
            raise PositionError(
                f"lm_eval --model relaylens: {count} {kind} request(s) need positions up to {worst - 1}, past the "
                f"model's range ({limit} positions: rotary max_position_embeddings, or max_length)"
                + (f" with condition {self.relay_condition.label}'s shift of {self.shift}" if self.shift else "")
                + "; relaylens does not truncate contexts. Fix: shorter contexts or max_gen_toks, a smaller shift, "
                  "or a model with a longer context")

    def _compress(self, context: list[int]):
        """``(prefill, selection, question ids)`` of a context, or None when it runs uncompressed (too_short=keep)."""
        if self._compressed is not None and self._compressed[0] == context:
            return self._compressed[1]
        history, question = context[:-self.question_tokens], context[-self.question_tokens:]
        try:
            if not history:
                raise TooShortError(f"the context has {len(context)} tokens, not more than question_tokens="
                                    f"{self.question_tokens}, so no history is left to compress")
            framing = torch.zeros(len(history), dtype=torch.bool)  # [L] the first framing_tokens: kept outside
            framing[:self.framing_tokens] = True
            prefill, selection = select_history(self.model, torch.tensor(history), self.relay_selector,
                                                self.relay_budget, None, self.window_size, self.factors,
                                                protect_instructions=framing if self.framing_tokens else False)
            compressed = (prefill, selection, torch.tensor(question))
        except (TooShortError, BudgetError) as err:
            if self.too_short == "error":
                raise type(err)(f"lm_eval --model relaylens: {err}. Fix: a smaller question_tokens or selector window "
                                "(selector_window=8), a larger budget, or too_short=keep to run such contexts "
                                "uncompressed") from None
            self.uncompressed += 1
            compressed = None
        self._compressed = (context, compressed)
        return compressed

    # ------------------------------------------------------------------------------------------- loglikelihood
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        """``(sum of continuation log-probabilities, whether greedy decoding yields it)`` per request, in order."""
        self._check_range([len(context) + len(continuation) - 1 for _, context, continuation in requests],
                          "loglikelihood")
        results = []
        for key, context, continuation in tqdm(requests, disable=disable_tqdm or self.rank != 0,
                                               desc="Running loglikelihood requests (relaylens)"):
            compressed = self._compress(list(context))
            fed = torch.tensor(list(context) + list(continuation)[:-1])  # what hf feeds; relaylens splits it
            if compressed is None:
                logits = self._model_call(fed[None].to(self.device))[0].float()  # [C + K - 1, vocab]
            else:
                prefill, selection, question = compressed
                ids = torch.cat((question, torch.tensor(list(continuation)[:-1], dtype=torch.long)))  # [Q + K - 1]
                logits = run_rows(self.model, prefill, [Row(selection, self.relay_condition)], ids, max_new_tokens=0,
                                  factors=self.factors, keep_question_logits=True)[0].question_logits
            logits = logits[-len(continuation):]  # [K, vocab]: each row scores the next continuation token
            target = torch.tensor(list(continuation), device=logits.device)
            log_probs = F.log_softmax(logits, dim=-1, dtype=self.softmax_dtype)
            answer = (float(log_probs.gather(-1, target[:, None]).sum()), bool((logits.argmax(-1) == target).all()))
            results.append(answer)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        self._log_uncompressed()
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        """Not supported: a rolling window over a whole document has no question to answer after a compressed
        context."""
        raise NotImplementedError(
            "lm_eval --model relaylens: loglikelihood_rolling (perplexity tasks such as wikitext) is not supported: "
            "a rolling window over a whole document has no question to answer after a compressed context. Fix: run "
            "loglikelihood or generate_until tasks with relaylens, perplexity tasks with --model hf")

    # ------------------------------------------------------------------------------------------ generate_until
    def generate_until(self, requests, disable_tqdm: bool = False):
        """The harness's ``generate_until`` (stop sequences, ``max_gen_toks``), each context decoded under the
        condition by ``model.generate()``; requests past the rotary range are refused first."""
        lengths = []
        for request in requests:
            context, gen_kwargs = request.args
            encoded, _ = self.tok_batch_encode([context])
            max_gen = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)["max_gen_toks"]
            lengths.append(int(encoded.shape[1]) + int(max_gen))
        self._check_range(lengths, "generate_until")
        try:
            return super().generate_until(requests, disable_tqdm=disable_tqdm)
        finally:
            self._log_uncompressed()

    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs) -> torch.Tensor:
        """``[B, T + new]`` like ``HFLM._model_generate``: each row's context (left padding dropped) compressed and
        decoded by ``model.generate()`` under the condition, new tokens right-padded with the pad token."""
        mask = generation_kwargs.pop("attention_mask", None)
        generation_kwargs["temperature"] = generation_kwargs.get("temperature", 0.0)  # HFLM's greedy default
        if generation_kwargs["temperature"] == 0.0 and generation_kwargs.get("do_sample") is None:
            generation_kwargs["do_sample"] = False
        if generation_kwargs.get("do_sample") is False and generation_kwargs["temperature"] == 0.0:
            generation_kwargs.pop("temperature")
        new_tokens = max_length - context.shape[1]
        rows = []
        for b in range(context.shape[0]):
            ids = context[b][mask[b].bool()] if mask is not None else context[b]  # [C] without left padding
            rows.append(self._generate_one(ids.cpu(), new_tokens, stop, dict(generation_kwargs)))
        width = max(row.numel() for row in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eot_token_id
        out = torch.full((context.shape[0], context.shape[1] + width), int(pad), dtype=torch.long,
                         device=context.device)
        out[:, :context.shape[1]] = context
        for b, row in enumerate(rows):
            out[b, context.shape[1]:context.shape[1] + row.numel()] = row.to(context.device)
        return out

    def _generate_one(self, ids: torch.Tensor, new_tokens: int, stop: list[str], kwargs: dict) -> torch.Tensor:
        """The new tokens ``[n]`` ``model.generate()`` produces for one context."""
        common = dict(max_new_tokens=new_tokens, pad_token_id=self.tokenizer.pad_token_id, use_cache=True, **kwargs)
        compressed = self._compress(ids.tolist())
        if compressed is None:
            criteria = stop_sequences_criteria(self.tokenizer, stop, ids.numel(), 1)
            out = self.model.generate(input_ids=ids[None].to(self.device), stopping_criteria=criteria,
                                      attention_mask=torch.ones(1, ids.numel(), dtype=torch.long, device=self.device),
                                      **common)
            return out[0, ids.numel():]
        prefill, selection, question = compressed
        criteria = stop_sequences_criteria(self.tokenizer, stop, question.numel(), 1)
        with relay_inputs(self.model, prefill, selection, self.relay_condition, question, self.factors,
                          max_new_tokens=new_tokens) as inputs:
            out = self.model.generate(**inputs.generate_kwargs(), stopping_criteria=criteria, **common)
        return out[0, question.numel():]

    def _log_uncompressed(self) -> None:
        if self.uncompressed:
            log.warning("relaylens: %d request(s) ran uncompressed (too_short=keep): their context was too short for "
                        "selector %s at budget %s", self.uncompressed, self.relay_selector.name,
                        self.relay_budget.label)

    def get_model_info(self) -> dict:
        """``hf``'s model info plus the relaylens settings (written into lm-eval's results file)."""
        framing = (f"protected (each context's first {self.framing_tokens} tokens kept outside the budget)"
                   if self.framing_tokens else "evicted (ablation: the framing competes for the budget; a harness "
                                               "context carries no spans)")
        return {**super().get_model_info(), "relaylens_selector": self.relay_selector.name,
                "relaylens_budget": self.relay_budget.label, "relaylens_condition": self.relay_condition.label,
                "relaylens_learned_sha256": self.learned_sha256, "relaylens_framing": framing,
                "relaylens_question_tokens": self.question_tokens, "relaylens_uncompressed": self.uncompressed}


def _refuse_remote_code(pretrained, kwargs: dict) -> None:
    """Refuse, before anything loads, what ``relaylens run`` refuses: ``trust_remote_code`` asked for, and a local
    model or tokenizer directory that declares custom code (``auto_map``,
    :func:`relaylens.model.loading.check_no_remote_code`; a hub config is checked in :func:`_check_config`)."""
    flag = kwargs.get("trust_remote_code")
    if flag not in (None, False) and str(flag).strip().lower() not in ("false", "0", "no"):
        raise ModelError(remote_code_refusal(str(pretrained), f"trust_remote_code={flag} was passed in --model_args"))
    for value in (pretrained, kwargs.get("tokenizer")):
        if isinstance(value, (str, os.PathLike)) and Path(value).expanduser().is_dir():
            check_no_remote_code(Path(value).expanduser(), str(value))


def _check_config(pretrained: str, kwargs: dict) -> None:
    """Refuse a model whose config declares custom code or no rotary embedding (the loaded model is checked
    again)."""
    try:
        config = AutoConfig.from_pretrained(pretrained, revision=kwargs.get("revision") or "main",
                                            trust_remote_code=False)
    except ValueError as err:
        if "trust_remote_code" in str(err):
            raise ModelError(remote_code_refusal(pretrained, "its config asks for code from the model repository")) \
                from None
        return  # hf reports what cannot be loaded
    except OSError:
        return  # hf reports what cannot be loaded
    if getattr(config, "auto_map", None):
        classes = ", ".join(sorted(map(str, config.auto_map)))
        raise ModelError(remote_code_refusal(pretrained, f"its config maps {classes} to code shipped with the model "
                                                         "(auto_map)"))
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not any(getattr(text, name, None) for name in ("rope_parameters", "rope_scaling", "rope_theta")):
        raise RopeError(f"lm_eval --model relaylens: {pretrained} ({type(config).__name__}) has no rotary position "
                             "embeddings, so there are no key positions to relocate. Fix: use a causal LM with rotary "
                             "embeddings (Llama, Qwen2, Gemma-3, Phi, ...)")


def _embedded(pretrained: str, kwargs: dict) -> tuple:
    """A relaylens embedded name loads through relaylens (pulled on first use); anything else is left to ``hf``."""
    if pretrained not in EMBEDDED:
        return pretrained, kwargs
    from relaylens.model.loading import load_model  # noqa: PLC0415 - late binding (tests swap loading.load_model)

    dtype = kwargs.pop("dtype", None)
    model, tokenizer = load_model(pretrained, dtype=None if dtype in (None, "auto") else dtype)
    return model, {**kwargs, "tokenizer": tokenizer}


def main(argv: list[str] | None = None) -> None:
    """The lm-eval command line with the ``relaylens`` model type registered (``python -m
    relaylens.integrations.lm_eval ...`` or ``relaylens-lm-eval ...`` take exactly ``lm_eval``'s arguments)."""
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
