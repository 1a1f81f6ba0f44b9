"""`--preview N`: the first N training rows of --data as the loss sees them, one JSON line each:
`{"text": <the rendered row>, "trained": [<each trained span, decoded>]}`, and `{"skipped": <file,
row and why>}` for a row a run skips (cache.Skipped; more than its share of the rows read
refuses the data, as the run would) (what axolotl's
`preprocess --debug` shows its users), read and tokenized exactly as a run would, before any
storage, download of weights or Ray: how a new dataset is checked before GPUs are paid for."""

from __future__ import annotations

from typing import Iterator

from training.config import TrainConfig
from training.data.cache import Skipped, documents, held_out
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
    """The first `count` training rows (held-out ones and those a run skips left out), as JSON
    objects."""
    if cfg.objective == "dpo":  # both answers of each pair, and what trains in each
        from training.data.preference import preview_pairs

        yield from preview_pairs(cfg, enc, count, spans)
        return
    skipped, shown = Skipped(), 0
    for doc, (_, _, _, ids, trained) in enumerate(documents(Source.open(cfg.data), enc,
                                                            cfg.loss_tokens, skipped)):
        yield from ({"skipped": why} for why in skipped.reasons[shown:])
        shown = len(skipped.reasons)
        if held_out(doc, cfg.eval_fraction):
            continue
        labels = [False, *trained[1:]]  # a document's first token is never a label (packing.py)
        yield {"text": enc.decode(ids), "trained": [enc.decode(s) for s in spans(ids, labels)]}
        count -= 1
        if count <= 0:
            break
    skipped.check()
