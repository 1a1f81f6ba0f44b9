"""Preference data for `--objective dpo`: TRL's preference format, tokenized as TRL's
`DPOTrainer` tokenizes it, packed in rows, and read back with the pairs' reference
log-probabilities.

TRL's formats (trl/data_utils.py, `is_conversational`, `extract_prompt`): `prompt`, `chosen`
and `rejected` as strings, or as message lists (the prompt's turns, then each answer's); or only
`chosen` and `rejected` whose shared beginning is the prompt (TRL's `extract_prompt`: the
longest common prefix of turns or characters, a string answer keeping the space before it).

`--seq-len L` is TRL's `max_length`: each of prompt + chosen and prompt + rejected keeps its
first L tokens on its own (`truncation_mode="keep_start"`), a pair whose prompt alone fills L is
dropped, as TRL drops it; both are counted. A row of `2 L + 1` tokens holds as many whole pairs
as fit: each pair's prompt + chosen as one document, its prompt + rejected as the next, then
padding at the row's end (untrained document starts). Only the answers are trained (TRL's
completion mask); no document attends to another (packing.decode restarts positions at each).
A row that cannot train (no answer of its own, a tie, a malformed turn) is skipped and counted
as SFT's are (cache.Skipped).
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np
import torch

from training.data.cache import (EVAL_FILE, TOKENS_FILE, TRAINED, Skipped, TokenCache,
                                 encoded_rows, held_out)
from training.data.formats import RowError, _messages
from training.data.packing import _M32, PairRows, Samples, _mix, decode
from training.data.source import Source
from training.data.tokenize import Encoded, Encoder, TokenizeError

FORMAT = "preference"
COLUMNS = ("chosen", "rejected")
TRAINS = "the chosen and rejected answers"


def split(row: dict) -> tuple[object, object, object]:
    """(prompt, chosen, rejected) of a row, the prompt extracted when implicit (TRL's
    `maybe_extract_prompt`: also when a string `prompt` sits beside conversational answers)."""
    for c in COLUMNS:
        if c not in row:
            raise RowError(f"no `{c}` column (preference data: `prompt` + `chosen` + "
                           "`rejected`, or `chosen` + `rejected` conversations)")
    chosen, rejected, prompt = row["chosen"], row["rejected"], row.get("prompt")
    if prompt is not None and isinstance(prompt, str) == isinstance(chosen, str):
        return prompt, chosen, rejected
    if isinstance(chosen, str) != isinstance(rejected, str):
        raise RowError("`chosen` and `rejected` must both be strings or both message lists")
    if not isinstance(chosen, str):
        chosen, rejected = _messages(chosen), _messages(rejected)
    n = extract_prompt_length(chosen, rejected)
    return chosen[:n], chosen[n:], rejected[n:]


def extract_prompt_length(chosen, rejected) -> int:
    """TRL 1.16.0's `extract_prompt` (trl/data_utils.py), characters or turns alike: up to the
    first place the two differ, one step back where a space comes before it, so a string
    answer starts with its space (`"The sky is"`, `" blue"`) as generation would write it. When
    one is the other's start, the loop's last index, as TRL's: the answers keep their last
    item."""
    idx = 0
    for idx in range(min(len(chosen), len(rejected))):
        if chosen[idx] != rejected[idx]:
            if chosen[idx - 1] == " ":
                idx -= 1
            break
    return idx


def encode_pair(row: dict, enc: Encoder) -> tuple[Encoded, Encoded]:
    """(ids, trained) of prompt + chosen and of prompt + rejected; only the answer trains.
    Strings as TRL tokenizes them: prompt + answer as one text (EOS after), the answer what it
    adds to the prompt's tokens (Encoder.prompt_completion)."""
    prompt, chosen, rejected = split(row)
    if chosen == rejected:
        raise RowError("`chosen` and `rejected` are the same answer: nothing to prefer")
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


def truncate(pair: tuple[Encoded, Encoded], max_length: int) -> tuple[Encoded, Encoded] | None:
    """TRL's `DPOTrainer(max_length=max_length, truncation_mode="keep_start")`: each of prompt +
    chosen and prompt + rejected keeps its first `max_length` tokens, on its own
    (`DataCollatorForPreference`); None where TRL drops the pair, a prompt of `max_length`
    tokens or more (its `_prepare_dataset` filter), which would train no answer token."""
    prompt = min(t.index(True) for _, t in pair)
    if prompt >= max_length:
        return None
    return tuple((ids[:max_length], t[:max_length]) for ids, t in pair)


class PairCache(TokenCache):
    """The token cache of preference data: pairs packed in rows of `2 * --seq-len + 1` tokens
    (two sequences of TRL's max_length), in source order; `--eval-fraction` holds out whole
    pairs, by the same count of encoded rows as SFT's documents (cache.held_out)."""

    @classmethod
    def for_run(cls, fs, run_dir: str, source: Source, tokenizer_name: str, seq_len: int,
                loss_tokens: str = "completion", eval_fraction: float = 0.0) -> "PairCache":
        base = TokenCache.for_run(fs, run_dir, source, tokenizer_name, seq_len,
                                  f"{FORMAT}-{loss_tokens}", eval_fraction)
        return cls(fs, base.directory, base.fingerprint)

    def _pack(self, source: Source, enc: Encoder, block: int, loss_tokens: str,
              eval_fraction: float, pad: bool) -> dict:
        max_length = block - 1  # TokenCache.build's block is --seq-len + 1
        width = pair_row_tokens(max_length)
        outs = [PairRows(self.fs, f"{self.directory}/{n}", width)
                for n in (TOKENS_FILE, EVAL_FILE)]
        skipped, dropped, truncated = Skipped(), 0, 0
        for row_number, (_, _, pair) in enumerate(encoded_rows(
                source, lambda row: encode_pair(row, enc), skipped)):
            kept = truncate(pair, max_length)
            if kept is None:
                dropped += 1
                continue
            truncated += kept != pair
            outs[int(held_out(row_number, eval_fraction))].add(kept)
        skipped.check()
        train, held = (out.close() for out in outs)
        return {"samples": train["rows"], "eval_samples": held["rows"], "sample_tokens": width,
                "source": source.uri, "data_format": FORMAT, "documents": train["pairs"],
                "eval_documents": held["pairs"], "pairs_per_row": train["pairs_per_row"],
                "eval_pairs_per_row": held["pairs_per_row"], "real_tokens": train["tokens"],
                "max_token_id": max(train["max_id"], held["max_id"]),
                "loss_tokens": loss_tokens, "trained_tokens": train["trained"],
                "dropped_pairs": dropped, "truncated_pairs": truncated, **skipped.index()}


def pair_row_tokens(max_length: int) -> int:
    """A pair row's width: room for two sequences of `max_length` (the +1: the last token is
    only a label, cache.py's `seq_len + 1`)."""
    return 2 * max_length + 1


def preview_pairs(cfg, enc: Encoder, count: int, spans) -> Iterator[dict]:
    """--preview with --objective dpo: the first `count` training pairs as the rows hold them,
    `{"chosen": <text>, "rejected": <text>, "trained": {"chosen": [...], "rejected": [...]}}`
    (each sequence after TRL's truncation; a label never starts a document)."""
    skipped, shown = Skipped(), 0
    for n, (_, _, pair) in enumerate(encoded_rows(Source.open(cfg.data),
                                                  lambda row: encode_pair(row, enc), skipped)):
        yield from ({"skipped": why} for why in skipped.reasons[shown:])
        shown = len(skipped.reasons)
        pair = truncate(pair, cfg.seq_len)
        if pair is None or held_out(n, cfg.eval_fraction):
            continue
        texts = {k: enc.decode(ids) for k, (ids, _) in zip(COLUMNS, pair)}
        trained = {k: [enc.decode(s) for s in spans(ids, [False, *t[1:]])]
                   for k, (ids, t) in zip(COLUMNS, pair)}
        yield {**texts, "trained": trained}
        count -= 1
        if count <= 0:
            return
    skipped.check()


class PairBatch(NamedTuple):
    """A micro-batch of pair rows: a Batch's tensors, the pairs' reference log-probabilities
    ([B, pairs, 2], chosen and rejected; None: the model computes them with its adapters off)
    and how many pairs a row holds at most (the file's, `pairs_per_row`)."""
    inputs: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    ref: torch.Tensor | None = None
    pairs: int = 1

    def to(self, device: torch.device) -> "PairBatch":
        return PairBatch(*(t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t
                           for t in self))


class PairSamples:
    """The pair rows of a PairCache file. Training (`seed`) reads them in a new seeded order
    every epoch (a hash of (seed, epoch, row), as packing.EpochOrder orders documents: sample i
    is a pure function of i, so a resume continues exactly); evaluation reads them in order."""

    def __init__(self, fs, directory: str, file: str = TOKENS_FILE, count_key: str = "samples",
                 seed: int | None = None, ref: np.ndarray | None = None):
        self.samples = Samples(fs, directory, file, count_key)
        index = TokenCache(fs, directory, "").index()
        self.pairs = index["eval_pairs_per_row" if count_key == "eval_samples"
                           else "pairs_per_row"]
        self.real_share = index["real_tokens"] / (index["samples"] * index["sample_tokens"])
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
        return PairBatch(*decode(rows), ref, self.pairs)

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
