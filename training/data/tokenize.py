"""Token ids of documents: the built-in byte tokenizer or a Hugging Face one."""

from __future__ import annotations

import functools

import numpy as np

BYTES = "bytes"  # built-in tokenizer: UTF-8 bytes, end-of-text 256 (no download, for the demo)
BYTES_VOCAB = 257


def tokenize(texts, tokenizer_name: str) -> np.ndarray:
    """Token ids of the documents, each followed by the end-of-text id, concatenated."""
    if tokenizer_name == BYTES:
        encode, eos = str.encode, BYTES_VOCAB - 1
    else:
        tok = _hf_tokenizer(tokenizer_name)
        encode = functools.partial(tok.encode, add_special_tokens=False)
        eos = tok.eos_token_id if tok.eos_token_id is not None else 0
    ids: list[int] = []
    for text in texts:
        ids.extend(encode(str(text)))
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64)


@functools.cache
def _hf_tokenizer(name: str):
    """Loaded once per Ray Data worker process, not once per batch."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)
