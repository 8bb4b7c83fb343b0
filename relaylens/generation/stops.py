"""Stop rules of greedy decoding resolved from token ids, so a decoding step can test them on the device.

The rows' rules (:func:`relaylens.generation.rows.decode_steps`): a row stops at an EOS token, or, with
``stop_at_newline``, at the first token after which the decoded answer (special tokens skipped) holds a newline past
its leading newlines: ``"\\n" in decode(ids).lstrip("\\n")``. The dynamic path decodes the row's text at every step;
:class:`StopTable` answers the same question from three per-token facts, read once per tokenizer:

- ``newline``: the token's text holds a newline;
- ``newline_after_content``: its text, leading newlines stripped, still holds one (it stops even a row that has shown
  only newlines so far);
- ``content``: its text holds a character other than a newline.

A row that has shown content stops at any ``newline`` token; before that, at a ``newline_after_content`` token.
A newline byte is never part of a multi-byte character, so for byte-level tokenizers (Qwen2, Llama-3, GPT-2
families) the per-token facts give the text rule exactly. Where decoding a token alone differs from decoding it in
context (a SentencePiece token that is a lone leading space), :func:`text_stop_index` checks the device's answer on
the host after decoding, at the few tokens that hold a newline, and the caller decodes again the dynamic way when they
disagree (:mod:`relaylens.generation.static`).

Axes: ``row`` (a batch row), ``vocab``.

Example:
    >>> import torch
    >>> from relaylens.testing import tiny_tokenizer
    >>> tokenizer = tiny_tokenizer()
    >>> table = StopTable.build(tokenizer, eos_token_ids={0}, vocab_size=len(tokenizer), stop_at_newline=True)
    >>> ids = tokenizer.encode("\\nyes\\nno", add_special_tokens=False)
    >>> seen = torch.zeros(1, dtype=torch.bool)
    >>> stops = []
    >>> for token in ids:
    ...     stop, seen = table.stops(torch.tensor([token]), seen)
    ...     stops.append(bool(stop))
    >>> stops.index(True) == text_stop_index(tokenizer, ids, table)
    True
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from relaylens.errors import RelaylensError

EOS, NEWLINE = 1, 2  # stop codes of a row on the device (0: not stopped)


@dataclass(frozen=True)
class StopTable:
    """Per-token stop facts (bool ``[vocab]``) of one tokenizer and EOS set; see the module docstring."""

    eos: torch.Tensor  # [vocab]
    newline: torch.Tensor  # [vocab]
    newline_after_content: torch.Tensor  # [vocab]
    content: torch.Tensor  # [vocab]
    stop_at_newline: bool

    @classmethod
    def build(cls, tokenizer, eos_token_ids, vocab_size: int, stop_at_newline: bool, device="cpu") -> StopTable:
        """The table of ``tokenizer`` (None: EOS only) over ``vocab_size`` logits, on ``device``."""
        eos = torch.zeros(vocab_size, dtype=torch.bool)
        outside = sorted(i for i in eos_token_ids if not 0 <= int(i) < vocab_size)
        if outside:
            raise RelaylensError(f"EOS ids {outside} are outside the model's {vocab_size} logits. Fix: pass the EOS "
                                 "ids of this model's tokenizer")
        eos[sorted(int(i) for i in eos_token_ids)] = True
        if stop_at_newline and tokenizer is not None:
            newline, after, content = _text_facts(tokenizer, vocab_size)
        else:
            newline = after = content = torch.zeros(vocab_size, dtype=torch.bool)
        on = functools.partial(torch.Tensor.to, device=device)
        return cls(on(eos), on(newline), on(after), on(content), bool(stop_at_newline and tokenizer is not None))

    def stops(self, tokens: torch.Tensor, seen_content: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(code [row], seen_content [row])`` after ``tokens`` ``[row]``: code :data:`EOS`, :data:`NEWLINE` or 0.

        Pure tensor work (no host read), so a compiled decoding step can run it.
        """
        eos = self.eos[tokens]
        code = torch.where(eos, EOS, 0)
        if self.stop_at_newline:
            newline = torch.where(seen_content, self.newline[tokens], self.newline_after_content[tokens])
            code = torch.where(~eos & newline, NEWLINE, code)
            seen_content = seen_content | self.content[tokens]
        return code, seen_content


@functools.lru_cache(maxsize=4)
def _text_facts(tokenizer, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(newline, newline_after_content, content)`` bool ``[vocab]``: each token decoded alone, special tokens
    skipped (ids past the tokenizer's vocabulary decode to nothing)."""
    known = min(vocab_size, len(tokenizer))
    texts = tokenizer.batch_decode([[i] for i in range(known)], skip_special_tokens=True)
    texts += [""] * (vocab_size - known)
    newline = torch.tensor(["\n" in text for text in texts])
    after = torch.tensor(["\n" in text.lstrip("\n") for text in texts])
    content = torch.tensor([bool(text.lstrip("\n").replace("\n", "")) for text in texts])
    return newline, after, content


def newline_stop(tokenizer, token_ids: list[int]) -> bool:
    """The text rule: the answer ``token_ids``, decoded with special tokens skipped, holds a newline past its leading
    newlines (the dynamic path tests it after every token; :class:`StopTable` answers it from token ids)."""
    return "\n" in tokenizer.decode(token_ids, skip_special_tokens=True).lstrip("\n")


def text_stop_index(tokenizer, token_ids: list[int], table: StopTable) -> int | None:
    """Index of the first token at which :func:`newline_stop` stops the answer ``token_ids`` (None: it does not),
    tested only at the tokens ``table`` says hold a newline (the rule can fire nowhere else)."""
    for index, token in enumerate(token_ids):
        if bool(table.newline[token]) and newline_stop(tokenizer, token_ids[: index + 1]):
            return index
    return None
