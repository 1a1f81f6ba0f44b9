"""`--objective dpo` on the workers: the reference log-probabilities without a second model, the
pair batches and the preference evaluation.

Full fine-tuning: the reference is the initial model, so its summed answer log-probabilities of
every pair (training and evaluation rows) are computed once, in a forward pass over the data
before the first step, and stored beside the token cache (`ref_logps-<key>.f32`, [rows,
pairs a row, 2] float32, written by rank 0). A resume reads them back: the weights it loads have moved, and
the reference must not (TRL's `precompute_ref_log_probs` keeps them in the dataset the same
way). LoRA: no table; the reference is the same model with its adapters off, per micro-batch
(model/dpo.py `adapters_off`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import pyarrow.fs as pafs
import torch
import torch.distributed as dist

from training.config import TrainConfig
from training.data import DataError
from training.data.cache import TOKENS_FILE
from training.data.prepare import PreparedData
from training.data.preference import PairSamples
from training.model.dpo import DpoObjective, PairStats, answer_logps, eval_mode
from training.step.engine import Engine
from training.step.memory import BatchPlan
from training.step.metrics import input_embedding


def table_name(cfg: TrainConfig, file: str) -> str:
    """The reference table of token file `file` for this model and its initial weights."""
    key = json.dumps([cfg.model, cfg.seed, cfg.attention, file])
    return f"ref_logps-{hashlib.sha256(key.encode()).hexdigest()[:12]}.f32"


def compute(engine: Engine, samples: PairSamples, batch: int, rank: int,
            world: int) -> np.ndarray:
    """Collective: every row's summed answer log-probabilities under the current weights; each
    rank computes its strided share, one all-reduce joins them."""
    out = torch.zeros(samples.n, samples.pairs, 2, dtype=torch.float64, device=engine.device)
    steps = -(-(-(-samples.n // world)) // batch)
    with torch.no_grad(), eval_mode(engine.model):
        for s in range(steps):
            picks = [rank + world * (s * batch + b) for b in range(batch)]
            b = samples.batch_of([min(p, samples.n - 1) for p in picks]).to(engine.device)
            logps = answer_logps(engine.model, b.inputs, b.labels, b.positions, b.pairs).double()
            real = torch.tensor([p < samples.n for p in picks], device=engine.device)
            index = torch.tensor([min(p, samples.n - 1) for p in picks], device=engine.device)
            out.index_add_(0, index[real], logps[real])
    if dist.is_initialized():
        dist.all_reduce(out)
    return out.float().cpu().numpy()


def reference_table(engine: Engine, fs: pafs.FileSystem, directory: str, file: str,
                    count_key: str, cfg: TrainConfig, batch: int, rank: int, world: int,
                    fresh: bool) -> np.ndarray:
    """The stored table on a resume; computed (and stored by rank 0) on a fresh run."""
    path = f"{directory}/{table_name(cfg, file)}"
    samples = PairSamples(fs, directory, file, count_key)
    if not fresh:
        if fs.get_file_info(path).type != pafs.FileType.File:
            raise DataError(f"the reference log-probabilities {path} are missing: this resume "
                            "cannot recompute them from moved weights; start a new run (--name)")
        with fs.open_input_stream(path) as f:
            return np.frombuffer(f.read(), dtype=np.float32).reshape(
                samples.n, samples.pairs, 2).copy()
    table = compute(engine, samples, batch, rank, world)
    if rank == 0:
        with fs.open_output_stream(path) as f:
            f.write(table.astype(np.float32).tobytes())
    if dist.is_initialized():
        dist.barrier()
    return table


@dataclass
class PreferenceEvaluator:
    """The held-out pairs' DPO loss (eval_loss) and TRL's eval_rewards/* (`metrics`), with the
    training step's reference (the table, or the adapters off)."""
    batches: list
    every: int
    steps: int
    beta: float
    metrics: dict | None = None

    def due(self, step: int) -> bool:
        return step in (0, self.steps) or bool(self.every) and step % self.every == 0

    def loss(self, engine: Engine) -> float:
        objective = DpoObjective(self.beta, PairStats())
        one = torch.ones((), device=engine.device)
        with torch.no_grad(), eval_mode(engine.model):
            for b in self.batches:
                objective.loss(engine.model, b.to(engine.device), one)
        sums = objective.stats.sums.clone()
        self.metrics = objective.stats.means("eval_")
        if dist.is_initialized():
            dist.all_reduce(sums)
        return float(sums[0] / sums[5].clamp(min=1))


def setup(cfg: TrainConfig, engine: Engine, data: PreparedData, fs: pafs.FileSystem,
          batch: BatchPlan, rank: int, world: int, fresh: bool):
    """(batch_at, evaluator) of a DPO attempt; sets the engine's objective."""
    size, full = batch.micro_batch_size, engine.lora is None
    if not full:  # MFU counts the reference's forward (2 FLOPs a weight and token) too, the
        # input embedding left out as in flops_per_token
        engine.flops_per_token += 2.0 * (engine.num_params
                                         - input_embedding(engine.model.lm.config))

    def table(directory: str, file: str, key: str) -> np.ndarray | None:
        return reference_table(engine, fs, directory, file, key, cfg, size, rank, world,
                               fresh) if full else None

    samples = PairSamples(fs, data.directory, seed=cfg.seed,
                          ref=table(data.directory, TOKENS_FILE, "samples"))
    engine.objective = DpoObjective(cfg.dpo_beta, real_share=samples.real_share)
    evaluator = None
    if data.eval is not None:
        ev = data.eval
        held = PairSamples(fs, ev.directory, ev.file, ev.count_key,
                           ref=table(ev.directory, ev.file, ev.count_key))
        evaluator = PreferenceEvaluator(held.strided(rank=rank, world=world, batch=size),
                                        cfg.eval_every, cfg.steps, cfg.dpo_beta)

    def batch_at(_step, seen, micro):
        return samples.batch(seen, rank=rank, world=world, micro=micro, batch=size)
    return batch_at, evaluator

