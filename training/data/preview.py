"""`--preview N`: the first N training rows of --data as the loss sees them, one JSON line each:
`{"text": <the rendered row>, "trained": [<each trained span, decoded>]}` (what axolotl's
`preprocess --debug` shows its users), read and tokenized exactly as a run would, before any
storage, download of weights or Ray: how a new dataset is checked before GPUs are paid for."""

from __future__ import annotations

from typing import Iterator

from training.config import TrainConfig
from training.data.cache import documents, held_out
from training.data.source import Source
from training.data.tokenize import Encoder


def spans(ids: list[int], trained: list[bool]) -> list[list[int]]:
    """The runs of consecutive trained tokens."""
    out: list[list[int]] = []
    for i, (token, t) in enumerate(zip(ids, trained)):
        if t:
            if i == 0 or not trained[i - 1]:
                out.append([])
            out[-1].append(token)
    return out


def preview(cfg: TrainConfig, enc: Encoder, count: int) -> Iterator[dict]:
    """The first `count` training rows (held-out ones skipped), as JSON objects."""
    if cfg.objective == "dpo":  # both answers of each pair, and what trains in each
        from training.data.preference import preview_pairs

        yield from preview_pairs(cfg, enc, count, spans)
        return
    rows = documents(Source.open(cfg.data), enc, cfg.loss_tokens)
    for doc, (_, _, _, ids, trained) in enumerate(rows):
        if held_out(doc, cfg.eval_fraction):
            continue
        labels = [False, *trained[1:]]  # a document's first token is never a label (packing.py)
        yield {"text": enc.decode(ids), "trained": [enc.decode(s) for s in spans(ids, labels)]}
        count -= 1
        if count <= 0:
            return
