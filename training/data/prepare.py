"""The driver's side of the data path: before Ray starts, tokenize and pack `--data` (and the
evaluation set) into the run directory, check the token ids against the model's vocabulary, and
say what the run trains on."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from training.config import RANDOM_DATA, TrainConfig
from training.data import DataError
from training.data.cache import EVAL_FILE, TOKENS_FILE, TokenCache
from training.data import preference
from training.data.formats import BY_NAME, listing
from training.data.preference import PairCache
from training.data.source import Source
from training.data.tokenize import BYTES, encoder
from training.storage import Storage


def tokenizer_name(cfg: TrainConfig) -> str:
    """--tokenizer (default --model), a directory made absolute."""
    name = cfg.tokenizer or cfg.model
    return os.path.abspath(name) if os.path.isdir(name) else name


@dataclass(frozen=True)
class EvalSet:
    """Where the evaluation samples are: held out of --data's cache (its eval file), or the
    separate --eval-data cache's own samples."""
    directory: str
    held_out: bool
    samples: int

    @property
    def file(self) -> str:
        return EVAL_FILE if self.held_out else TOKENS_FILE

    @property
    def count_key(self) -> str:
        """The cache index's count of this file's samples."""
        return "eval_samples" if self.held_out else "samples"


@dataclass(frozen=True)
class PreparedData:
    """What the driver tokenized for the workers (`DataPlan.build`): where the samples are, the
    data's identity (a resume on other data is refused), its format, the evaluation set, the
    run's steps (--epochs: derived from the samples) and the log's line on what it trains on."""
    directory: str
    fingerprint: str
    data_format: str
    eval: EvalSet | None
    summary: str
    steps: int
    # the rows left out or cut: skipped (cannot train), and DPO's dropped and truncated pairs
    rows: dict | None = None


def samples_per_step(cfg: TrainConfig) -> int:
    """Samples all workers consume in one optimizer step (memory.plan_batch keeps
    --tokens-per-step's count of sequences whatever micro-batch it picks)."""
    return cfg.sequences_per_worker(cfg.num_workers) * cfg.num_workers


def run_steps(cfg: TrainConfig, samples: int) -> int:
    """--steps, or the steps of --epochs passes over `samples` (rounded up, as HF Trainer's
    max_steps from num_train_epochs)."""
    if cfg.epochs is None:
        return cfg.steps
    return max(1, math.ceil(cfg.epochs * samples / samples_per_step(cfg)))


@dataclass(frozen=True)
class DataPlan:
    """Where a run's tokenized data lives; built once per job on the driver."""
    cfg: TrainConfig
    source: Source
    cache: TokenCache
    eval_source: Source | None
    eval_cache: TokenCache | None

    @classmethod
    def for_run(cls, cfg: TrainConfig, storage: Storage) -> "DataPlan | None":
        """None for random tokens."""
        if cfg.data in RANDOM_DATA:
            return None
        run_dir, tok = storage.run_dir(cfg.name), tokenizer_name(cfg)
        source = Source.open(cfg.data)
        kind = PairCache if cfg.objective == "dpo" else TokenCache  # one pair a row
        cache = kind.for_run(storage.filesystem, run_dir, source, tok, cfg.seq_len,
                                   cfg.loss_tokens, cfg.eval_fraction)
        eval_source = Source.open(cfg.eval_data, "--eval-data") if cfg.eval_data else None
        eval_cache = eval_source and kind.for_run(storage.filesystem, run_dir, eval_source,
                                                        tok, cfg.seq_len, cfg.loss_tokens)
        return cls(cfg, source, cache, eval_source, eval_cache)

    @property
    def fingerprint(self) -> str:
        """The training data's identity, with the seed of its document order (a resume on
        other data, or in another order, is refused)."""
        return f"{self.cache.fingerprint}-seed{self.cfg.seed}"

    def build(self, model_vocab: int) -> PreparedData:
        """Tokenize (or reuse), check, and return what the workers read."""
        cfg, tok = self.cfg, tokenizer_name(self.cfg)
        enc = encoder(tok)
        index = self.cache.build(self.source, enc, cfg.seq_len, cfg.loss_tokens,
                                 cfg.eval_fraction)
        _check_vocab(index, model_vocab, tok, cfg)
        if index["samples"] < 1:
            raise DataError(f"--data {cfg.data!r} holds no text (or too little to fill one "
                            f"{cfg.seq_len + 1}-token sample); add data or lower --seq-len")
        evaluated = None
        if self.eval_cache is not None:
            ev = self.eval_cache.build(self.eval_source, enc, cfg.seq_len, cfg.loss_tokens,
                                       pad=True)
            evaluated = EvalSet(self.eval_cache.directory, held_out=False, samples=ev["samples"])
            _check_vocab(ev, model_vocab, tok, cfg)
        elif cfg.eval_fraction:
            if index["eval_samples"] < 1:
                raise DataError(f"--eval-fraction {cfg.eval_fraction} of --data {cfg.data!r} "
                                "holds no document; raise it or use --eval-data")
            evaluated = EvalSet(self.cache.directory, held_out=True,
                                samples=index["eval_samples"])
        return PreparedData(self.cache.directory, self.fingerprint, index["data_format"],
                            evaluated, describe(cfg, index, evaluated),
                            run_steps(cfg, index["samples"]), row_counts(index))


def _check_vocab(index: dict, model_vocab: int, tok: str, cfg: TrainConfig) -> None:
    """An id beyond the embedding would be a device-side assert on the cluster, after boot."""
    if index["max_token_id"] >= model_vocab:
        raise DataError(f"the data's token ids reach {index['max_token_id']} (tokenizer "
                        f"{tok!r}) but --model {cfg.model!r} has a vocabulary of {model_vocab}: "
                        "use the model's own tokenizer (--tokenizer) or another model")


def describe(cfg: TrainConfig, index: dict | None, evaluated: EvalSet | None) -> str:
    """The log's line on what the run trains on."""
    if index is None:
        formats = listing(lambda f: "/".join(f.columns))
        return (f"data: {cfg.data} tokens, for transport and throughput checks only: nothing "
                f"real is learned (pass --data with {formats} files)")
    fmt = index["data_format"]
    trains_on = preference.TRAINS if fmt == preference.FORMAT else \
        "every token" if cfg.loss_tokens == "all" else BY_NAME[fmt].trains
    held = f"; evaluated on {evaluated.samples} samples" if evaluated else ""
    tokenizer = "bytes (built in)" if tokenizer_name(cfg) == BYTES else tokenizer_name(cfg)
    steps, per_step = run_steps(cfg, index["samples"]), samples_per_step(cfg)
    unit, width = "documents", cfg.seq_len + 1
    if fmt == preference.FORMAT:  # pairs packed; TRL's truncation and drops, counted
        unit = (f"pairs (each sequence at most {cfg.seq_len} tokens: "
                f"{index['truncated_pairs']} truncated, {index['dropped_pairs']} dropped with "
                f"a prompt of {cfg.seq_len} tokens or more, as TRL's max_length),")
        width = index["sample_tokens"]
    return (f"data: {fmt} format, {index['documents']} {unit} in {index['samples']} samples "
            f"of {width} tokens (tokenizer {tokenizer}), loss on {trains_on}{held}; "
            f"{steps} steps of {per_step} samples = {steps * per_step / index['samples']:.2f} "
            f"epochs, each in its own document order{_skipped(index)}")


def row_counts(index: dict) -> dict:
    """The summary's `data_rows`: what the build left out or cut (0 where it does not apply)."""
    keys = ("skipped_rows", "dropped_pairs", "truncated_pairs")
    return {k: index.get(k, 0) for k in keys}


def _skipped(index: dict) -> str:
    """The log's note on the rows the build skipped (cache.Skipped), with the first reasons."""
    if not index.get("skipped_rows"):
        return ""
    return (f"; skipped {index['skipped_rows']} row(s) that cannot be trained on: "
            + "; ".join(index["skipped_reasons"]))
