"""`train_func`: what every Ray Train worker runs.

Sets up one attempt from the driver's WorkerInputs (transport guard, model and optimizer from
the batch plan, resume, the data, the evaluation set, the test hooks) and hands it to the
step loop (trainer.py).
"""

from __future__ import annotations

import dataclasses
import os
import time

import torch

from training.config import RANDOM_DATA, TrainConfig
from training.data.packing import Samples
from training.data.prepare import PreparedData
from training.data.random_tokens import random_batch
from training.run.worker import worker_context
from training.model.model import model_config
from training.network import bandwidth, transport
from training.run import checkpoint
from training.run.evaluate import Evaluator
from training.run.handoff import WorkerInputs
from training.run.hooks import FaultHooks
from training.run.run_files import RunFiles
from training.run.trainer import BatchAt, Trainer
from training.step.engine import build_engine
from training.step.memory import BatchPlan
from training.step.schedule import Schedule, resume_schedule


def train_func(loop_config: dict) -> None:
    inputs = WorkerInputs.from_loop_config(loop_config)
    cfg, data = inputs.cfg, inputs.data
    rank, world, _, device = worker_context()
    marks = {"train_started": time.time()}  # wall clock: the cold-start timeline's milestones
    link, preflight = _check_network(cfg, rank, device)
    marks["nccl_ready"] = time.time()

    engine = build_engine(cfg, model_config(cfg.model, inputs.vocab_size), device)
    batch = engine.plan.batch  # --tokens-per-step: the planner chose it to fit memory
    saved = checkpoint.resume(engine)
    state, schedule, notes = start_state(cfg, saved, data.fingerprint if data else cfg.data)
    if rank == 0 and saved and saved.step != inputs.resumed_from_step:  # the driver said the rest
        print(f"after a failure: resuming from the checkpoint of step {saved.step}", flush=True)
        for note in notes:
            print(f"WARNING: {note}", flush=True)
    if rank == 0 and engine.load:
        print(f"load: {engine.load['load_s']:.1f} s, peak host RSS per rank (GiB) "
              f"{engine.load['load_host_rss_gib']}", flush=True)

    batch_at = _batches(cfg, batch, rank, world, inputs.vocab_size or
                        engine.model.lm.config.vocab_size, data)
    marks["model_ready"] = time.time()
    info = {"world_size": world, "resumed_from_step": saved.step if saved else None,
            "nccl_transport": link.verdict, "nccl_nodes": link.nodes, "efa_preflight": preflight,
            "num_params": engine.num_params, "cold_start_marks": marks,
            "waited_for_workers_s": inputs.waited_for_workers_s,
            "time_to_first_step_s": None, **dataclasses.asdict(engine.plan), **engine.load,
            **bandwidth.probe(engine.mesh, device)}
    evaluator = Evaluator.for_run(RunFiles.from_context().fs, data and data.eval, cfg, batch,
                                  rank, world)
    hooks = FaultHooks.for_rank(cfg, resumed=saved is not None, rank=rank, world=world)
    Trainer(cfg, engine, batch_at, state, schedule, info, rank, inputs.run_started_at,
            evaluator, hooks).train()


def _check_network(cfg: TrainConfig, rank: int, device: torch.device):
    """The EFA preflight and the transport NCCL chose (stops the run when it is not the expected
    one and --on-fallback fail); rank 0 warns of a fallback."""
    log_path = transport.capture_nccl_log(rank)
    preflight = _preflight(cfg)
    link = transport.check_transport(log_path, device, cfg.expect_transport, cfg.on_fallback)
    if rank == 0 and link.message:
        print(f"WARNING: {link.message}", flush=True)
    return link, preflight


def start_state(cfg: TrainConfig, saved: checkpoint.RunState | None,
                data_id: str) -> tuple[checkpoint.RunState, Schedule, list[str]]:
    """Where this attempt starts, its schedule (the saved one, extended to --steps), and the
    warnings for settings the saved run overrides. Refuses a checkpoint trained on other data:
    its sample position would mean nothing here."""
    if saved is None:
        fresh = Schedule.from_config(cfg)
        return checkpoint.RunState(step=0, schedule=fresh.to_dict(), data=data_id), fresh, []
    if saved.data != data_id:
        raise checkpoint.CheckpointError(
            f"run {cfg.name!r} was trained on other data ({saved.data}, this run: {data_id}): "
            "its data position does not apply; use the same --data, --tokenizer, --seq-len and "
            "--seed, or a new --name")
    schedule, notes = resume_schedule(saved.schedule, peak=cfg.lr, warmup=cfg.warmup_steps,
                                      total=cfg.steps, at_step=saved.step)
    return dataclasses.replace(saved, schedule=schedule.to_dict()), schedule, notes


def _preflight(cfg: TrainConfig) -> str:
    """EFA checks where EFA is expected or present; skipped cleanly off AWS."""
    if cfg.expect_transport != "efa" and not os.path.exists("/dev/infiniband"):
        return "skipped: no EFA device here"
    problems = transport.efa_preflight()
    if problems and cfg.expect_transport == "efa" and cfg.on_fallback == "fail":
        raise transport.TransportError("EFA preflight failed: " + "; ".join(problems))
    return "ok" if not problems else "failed: " + "; ".join(problems)


def _batches(cfg: TrainConfig, batch: BatchPlan, rank: int, world: int, vocab: int,
             data: PreparedData | None) -> BatchAt:
    """(step, samples seen before it, micro-batch index) -> this rank's micro-batch."""
    size = batch.micro_batch_size
    if cfg.data in RANDOM_DATA:
        return lambda step, _seen, micro: random_batch(
            seed=cfg.seed, rank=rank, step=step, micro=micro, batch=size,
            seq_len=cfg.seq_len, vocab=vocab, repeat=cfg.data == "repeat")
    samples = Samples(RunFiles.from_context().fs, data.directory, seed=cfg.seed)
    return lambda _step, seen, micro: samples.batch(seen, rank=rank, world=world, micro=micro,
                                                   batch=size)
