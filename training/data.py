"""Training batches: deterministic random tokens, or real text through Ray Data.

Random tokens (the reference's mode) are a pure function of (seed, rank, step, micro-batch), so a
resumed run sees exactly the batches it would have seen. Text is read, tokenized and packed into
`seq_len + 1`-token blocks by Ray Data on the driver's cluster and streamed to each worker's shard.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

RANDOM_MODES = ("random", "repeat")
TEXT_SUFFIXES = (".jsonl", ".json", ".parquet")


class DataError(ValueError):
    """The --data source cannot feed training."""


def random_batch(*, seed: int, rank: int, step: int, micro: int, batch: int, seq_len: int,
                 vocab: int, repeat: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of shape [batch, seq_len]; `repeat` returns the same batch every step."""
    key = (seed, rank) if repeat else (seed, rank, step, micro)
    g = torch.Generator().manual_seed(hash(key) & 0x7FFF_FFFF_FFFF_FFFF)
    tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def text_format(uri: str) -> str:
    """`json` or `parquet`, from the path's suffix (a directory is read as jsonl)."""
    lowered = uri.rstrip("/").lower()
    if lowered.endswith(".parquet"):
        return "parquet"
    return "json"


def build_text_dataset(uri: str, tokenizer_name: str, seq_len: int):
    """A Ray Dataset of packed token blocks (`tokens`: int64[seq_len + 1])."""
    import ray.data

    reader = ray.data.read_parquet if text_format(uri) == "parquet" else ray.data.read_json
    try:
        ds = reader(uri)
    except Exception as e:  # Ray wraps filesystem errors in many types; report the cause plainly
        raise DataError(f"--data {uri!r}: cannot read it ({str(e).splitlines()[0]})") from None
    if "text" not in (ds.schema().names if ds.schema() else []):
        raise DataError(f"--data {uri!r}: no `text` column (found {ds.schema()})")
    block = seq_len + 1

    def tokenize_and_pack(batch: dict) -> dict:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_name)
        eos = tok.eos_token_id if tok.eos_token_id is not None else 0
        ids: list[int] = []
        for text in batch["text"]:
            ids.extend(tok(str(text), add_special_tokens=False)["input_ids"])
            ids.append(eos)
        n = len(ids) // block
        packed = np.asarray(ids[: n * block], dtype=np.int64).reshape(n, block)
        return {"tokens": packed}

    return ds.map_batches(tokenize_and_pack, batch_size=256, batch_format="numpy")


def text_batches(shard, batch: int, skip: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless micro-batches from a worker's dataset shard, epoch after epoch, skipping `skip`."""
    seen = 0
    while True:
        produced = False
        for b in shard.iter_torch_batches(batch_size=batch, drop_last=True, dtypes=torch.int64):
            produced = True
            seen += 1
            if seen <= skip:
                continue
            tokens = b["tokens"]
            yield tokens[:, :-1], tokens[:, 1:]
        if not produced:
            raise DataError("this worker's share of --data holds no full micro-batch; use more "
                            "text, a smaller --seq-len or --micro-batch-size, or fewer workers")
