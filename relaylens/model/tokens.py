"""Token ids of text that is *data*: the one helper the prompt renderer (:mod:`relaylens.datasets.prompting`) and the
local judge (:mod:`relaylens.scoring.judge`) tokenise dataset text and candidate answers with, so that a special-token
string written in the data never becomes a control token.

Torch-free: it calls the tokenizer only (the datasets and scoring stages import it and stay torch-free).
"""

from __future__ import annotations


def encode_data_text(tokenizer, text: str, start: int = 0, end: int | None = None) -> tuple[list[int],
                                                                                            list[tuple[int, int]]]:
    """Token ids and character offsets of ``text`` where ``text[start:end]`` is *data* (dataset text): special-token
    strings written in the data (``<|im_end|>``, ``<start_of_turn>``) are tokenised as the plain text they are, never
    as control tokens; only the template's own markers outside ``[start, end)`` stay special.

    Data text without special-token strings tokenises exactly as the whole ``text`` would (the template's markers
    and the data then never share a token); with them, the data piece is tokenised on its own with
    ``split_special_tokens=True``.

    >>> from relaylens.testing import tiny_tokenizer
    >>> tok = tiny_tokenizer()
    >>> ids, _ = encode_data_text(tok, "a" + tok.eos_token + "b", 0, None)
    >>> tok.eos_token_id in ids, tok.eos_token_id in encode_data_text(tok, "a" + tok.eos_token + "b", 0, 1)[0]
    (False, True)
    """
    end = len(text) if end is None else end
    data = text[start:end]
    specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if t]
    if not any(t in data for t in specials):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    for a, b, split in ((0, start, False), (start, end, True), (end, len(text), False)):
        if a == b:
            continue
        enc = tokenizer(text[a:b], add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=split)
        ids += list(enc["input_ids"])
        offsets += [(s + a, e + a) for s, e in enc["offset_mapping"]]
    return ids, offsets
