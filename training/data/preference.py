"""Preference data for `--objective dpo`: TRL's preference format, tokenized and packed one pair
to a row, and read back with the pair's reference log-probabilities.

TRL's formats (trl/data_utils.py, `is_conversational`, `extract_prompt`): `prompt`, `chosen`
and `rejected` as strings, or as message lists (the prompt's turns, then each answer's); or only
`chosen` and `rejected` whose shared beginning is the prompt (conversations: the longest common
prefix of turns, TRL's `extract_prompt`; strings: of characters, cut back to a word boundary).

A row of the token cache holds one pair: prompt + chosen as one document, prompt + rejected as
the next, then padding (untrained document starts, as the evaluation's). Only the answers are
trained (TRL's completion mask); the chosen and rejected documents never attend to each other
(packing.decode restarts positions at each document). A pair too long for a row keeps the
start of each sequence (TRL's `truncation_mode="keep_start"`); one whose prompt alone leaves
no answer token in the row is skipped and counted (TRL drops prompts over max_length).
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np
import torch

from training.data import DataError
from training.data.cache import DTYPE, EVAL_FILE, START, TOKENS_FILE, TRAINED, TokenCache, held_out
from training.data.formats import RowError, _messages
from training.data.packing import _M32, Samples, _mix, decode
from training.data.source import Source
from training.data.tokenize import Encoded, Encoder, TokenizeError

FORMAT = "preference"
COLUMNS = ("chosen", "rejected")
TRAINS = "the chosen and rejected answers"


def split(row: dict) -> tuple[object, object, object]:
    """(prompt, chosen, rejected) of a row, the prompt extracted when implicit."""
    for c in COLUMNS:
        if c not in row:
            raise RowError(f"no `{c}` column (preference data: `prompt` + `chosen` + "
                           "`rejected`, or `chosen` + `rejected` conversations)")
    chosen, rejected, prompt = row["chosen"], row["rejected"], row.get("prompt")
    if prompt is not None:
        return prompt, chosen, rejected
    if isinstance(chosen, str) and isinstance(rejected, str):
        n = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b),
                 min(len(chosen), len(rejected)))
        n = chosen.rfind(" ", 0, n + 1) + 1 if n < len(chosen) and n else n
        return chosen[:n], chosen[n:], rejected[n:]
    c, r = _messages(chosen), _messages(rejected)
    n = next((i for i, (a, b) in enumerate(zip(c, r)) if a != b), min(len(c), len(r)))
    if n == len(c) or n == len(r):
        raise RowError("`chosen` and `rejected` share every turn of one of them: no answer of "
                       "its own to prefer")
    return c[:n], c[n:], r[n:]


def encode_pair(row: dict, enc: Encoder) -> tuple[Encoded, Encoded]:
    """(ids, trained) of prompt + chosen and of prompt + rejected; only the answer trains."""
    prompt, chosen, rejected = split(row)
    try:
        if all(isinstance(v, str) for v in (prompt, chosen, rejected)):
            out = enc.prompt_completion(prompt, chosen), enc.prompt_completion(prompt, rejected)
        else:
            turns = _messages(prompt) if prompt else []
            n_prompt = len(enc.chat(turns)[0]) if turns else 0
            out = tuple(_answer_only(enc.chat(turns + _messages(a)), n_prompt)
                        for a in (chosen, rejected))
    except TokenizeError as e:
        raise RowError(str(e)) from None
    for name, (_, trained) in zip(COLUMNS, out):
        if not any(trained[1:]):
            raise RowError(f"`{name}` has no token to train on (an empty answer)")
    return out


def _answer_only(encoded: Encoded, n_prompt: int) -> Encoded:
    ids, trained = encoded
    return ids, [t and i >= n_prompt for i, t in enumerate(trained)]


def fit(pair: tuple[Encoded, Encoded], width: int) -> tuple[Encoded, Encoded] | None:
    """The pair cut to share one row of `width` tokens (each sequence keeps its start: the
    shorter whole when it fits in half, the other the rest); None when an answer keeps no
    trained label."""
    (c, ct), (r, rt) = pair
    if len(c) + len(r) > width:
        half = width // 2
        keep_c = len(c) if len(c) <= half else width - min(len(r), half)
        keep_c = min(keep_c, len(c))
        keep_r = width - keep_c
        c, ct, r, rt = c[:keep_c], ct[:keep_c], r[:keep_r], rt[:keep_r]
    if not any(ct[1:]) or not any(rt[1:]):
        return None
    return (c, ct), (r, rt)


class PairCache(TokenCache):
    """The token cache of preference data: one pair a row (the layout above), in source order;
    `--eval-fraction` holds out whole pairs."""

    @classmethod
    def for_run(cls, fs, run_dir: str, source: Source, tokenizer_name: str, seq_len: int,
                loss_tokens: str = "completion", eval_fraction: float = 0.0) -> "PairCache":
        base = TokenCache.for_run(fs, run_dir, source, tokenizer_name, seq_len,
                                  f"{FORMAT}-{loss_tokens}", eval_fraction)
        return cls(fs, base.directory, base.fingerprint)

    def _pack(self, source: Source, enc: Encoder, block: int, loss_tokens: str,
              eval_fraction: float, pad: bool) -> dict:
        names = (TOKENS_FILE, EVAL_FILE)
        outs = [self.fs.open_output_stream(f"{self.directory}/{n}") for n in names]
        counts, max_id, skipped, trained_tokens = [0, 0], -1, 0, 0
        try:
            for where, number, row in source.rows():
                try:
                    pair = fit(encode_pair(row, enc), block)
                except RowError as e:
                    raise DataError(f"{where} row {number}: {e}") from None
                if pair is None:
                    skipped += 1
                    continue
                which = int(held_out(sum(counts), eval_fraction))
                outs[which].write(row_of(pair, block).tobytes())
                counts[which] += 1
                max_id = max(max_id, *pair[0][0], *pair[1][0])
                trained_tokens += sum(pair[0][1]) + sum(pair[1][1])
        finally:
            for out in outs:
                out.close()
        return {"samples": counts[0], "eval_samples": counts[1], "sample_tokens": block,
                "source": source.uri, "data_format": FORMAT, "documents": counts[0],
                "eval_documents": counts[1], "max_token_id": max_id, "loss_tokens": loss_tokens,
                "trained_tokens": trained_tokens, "skipped_pairs": skipped}


def row_of(pair: tuple[Encoded, Encoded], width: int) -> np.ndarray:
    """One cache row (cache.py's token layout): the chosen document, the rejected one, then
    untrained document starts (no label, a position of their own) to `width`."""
    row = np.full(width, START, dtype=DTYPE)
    at = 0
    for ids, trained in pair:
        flags = np.where(np.asarray(trained), TRAINED, np.uint32(0))
        flags[0] |= START
        row[at:at + len(ids)] = np.asarray(ids, dtype=DTYPE) | flags
        at += len(ids)
    return row


def preview_pairs(cfg, enc: Encoder, count: int, spans) -> Iterator[dict]:
    """--preview with --objective dpo: the first `count` training pairs as the rows hold them,
    `{"chosen": <text>, "rejected": <text>, "trained": {"chosen": [...], "rejected": [...]}}`
    (each document rendered after the row's cut; a label never starts a document)."""
    pairs = 0
    for where, number, row in Source.open(cfg.data).rows():
        try:
            pair = fit(encode_pair(row, enc), cfg.seq_len + 1)
        except RowError as e:
            raise DataError(f"{where} row {number}: {e}") from None
        if pair is None or held_out(pairs, cfg.eval_fraction):
            pairs += pair is not None
            continue
        pairs += 1
        texts = {k: enc.decode(ids) for k, (ids, _) in zip(COLUMNS, pair)}
        trained = {k: [enc.decode(s) for s in spans(ids, [False, *t[1:]])]
                   for k, (ids, t) in zip(COLUMNS, pair)}
        yield {**texts, "trained": trained}
        count -= 1
        if count <= 0:
            return


class PairBatch(NamedTuple):
    """A micro-batch of pairs: a Batch's tensors and the pairs' reference log-probabilities
    ([B, 2], chosen and rejected; None: the model computes them with its adapters off)."""
    inputs: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    ref: torch.Tensor | None = None

    def to(self, device: torch.device) -> "PairBatch":
        return PairBatch(*(None if t is None else t.to(device, non_blocking=True) for t in self))


class PairSamples:
    """The pair rows of a PairCache file. Training (`seed`) reads them in a new seeded order
    every epoch (a hash of (seed, epoch, row), as packing.EpochOrder orders documents: sample i
    is a pure function of i, so a resume continues exactly); evaluation reads them in order."""

    def __init__(self, fs, directory: str, file: str = TOKENS_FILE, count_key: str = "samples",
                 seed: int | None = None, ref: np.ndarray | None = None):
        self.samples = Samples(fs, directory, file, count_key)
        self.n, self.seed, self.ref = self.samples.n, seed, ref
        self._epoch, self._perm = None, None

    def rows(self) -> np.ndarray:
        return self.samples.tokens[:self.n * self.samples.width].reshape(self.n, -1)

    def index(self, i: int) -> int:
        """The file row of sample i (counted across epochs)."""
        epoch, k = divmod(i, self.n)
        if self.seed is None:
            return k
        if epoch != self._epoch:
            salt = _mix(np.array([(self.seed & _M32) << 32 | (epoch & _M32)], dtype=np.uint64))
            self._perm = np.argsort(_mix(np.arange(self.n, dtype=np.uint64) ^ salt),
                                    kind="stable")
            self._epoch = epoch
        return int(self._perm[k])

    def batch_of(self, picks: list[int], empty: list[bool] | None = None) -> PairBatch:
        rows = self.rows()[picks].copy()
        if empty:
            rows[empty] &= ~TRAINED
        ref = None if self.ref is None else torch.from_numpy(self.ref[picks].copy())
        return PairBatch(*decode(rows), ref)

    def batch(self, samples_seen: int, *, rank: int, world: int, micro: int,
              batch: int) -> PairBatch:
        start = samples_seen + (micro * world + rank) * batch  # packing.sample_start
        return self.batch_of([self.index(i) for i in range(start, start + batch)])

    def strided(self, *, rank: int, world: int, batch: int) -> list[PairBatch]:
        """Every row once, strided over the ranks, the same number of micro-batches on each
        (FSDP's forward is collective), the shortfall as rows with no label."""
        steps = -(-(-(-self.n // world)) // batch)
        out = []
        for s in range(steps):
            picks = [rank + world * (s * batch + b) for b in range(batch)]
            out.append(self.batch_of([min(p, self.n - 1) for p in picks],
                                     [p >= self.n for p in picks]))
        return out
