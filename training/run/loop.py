"""`train_func`: what every Ray Train worker runs.

Sets up one attempt from the driver's WorkerInputs (transport guard, model and optimizer from
the driver's run plan, resume, the data, the evaluation set, the test hooks, the run's facts)
and hands it to the step loop (trainer.py).
"""

from __future__ import annotations

import os
import time

import torch

from training.config import RANDOM_DATA, TrainConfig
from training.data.packing import Samples
from training.data.prepare import PreparedData
from training.data.random_tokens import random_batch
from training.network import bandwidth, link_floor, transport
from training.run import checkpoint, preemption, reference_logps
from training.run.evaluate import Evaluator
from training.run.facts import LinkShares, RunFacts
from training.run.handoff import WorkerInputs
from training.run.hooks import FaultHooks, hold_in_load
from training.run.run_files import RunFiles
from training.run.trainer import BatchAt, Trainer
from training.run.worker import worker_context
from training.step.engine import build_engine
from training.step.memory import BatchPlan
from training.step.step_time import StepPlan


def train_func(loop_config: dict) -> None:
    inputs = WorkerInputs.from_loop_config(loop_config)
    plan = inputs.plan
    cfg, data = plan.cfg, plan.data
    rank, world, _, device = worker_context()
    preemption.keep_node()  # from the first second: a reclaim while loading is a preemption too
    marks = {"train_started": time.time()}  # wall clock: the cold-start timeline's milestones
    link, preflight = _check_network(cfg, rank, device)
    marks["nccl_ready"] = time.time()

    # The driver's plan as given: its LoRA adapters, its step plan and mesh (driver/plan.py).
    hold_in_load(cfg, rank)  # the model's load begins here
    engine = build_engine(cfg, plan.model, device, plan=plan.step, spec=plan.lora)
    batch = engine.plan.batch
    saved = checkpoint.resume(engine)
    state, schedule, notes = checkpoint.start_state(cfg, saved, plan.data_id)
    if rank == 0 and saved and saved.step != plan.resumed_from_step:  # the driver said the rest
        print(f"restarted (after a preemption or a failure): resuming from the checkpoint of "
              f"step {saved.step}", flush=True)
        for note in notes:
            print(f"WARNING: {note}", flush=True)
    if rank == 0 and engine.load:
        print(f"load: {engine.load.load_s:.1f} s, peak host RSS per rank (GiB) "
              f"{engine.load.load_host_rss_gib}", flush=True)

    fs = RunFiles.from_context().fs
    if cfg.objective == "dpo":  # pairs, their reference log-probabilities, the objective
        batch_at, evaluator = reference_logps.setup(cfg, engine, data, fs, batch, rank, world,
                                                    fresh=saved is None)
    else:
        batch_at = _batches(cfg, batch, rank, world, plan.model.vocab_size, data)
        evaluator = Evaluator.for_run(fs, data and data.eval, cfg, batch, rank, world)
    marks["model_ready"] = time.time()
    probe = _probe_link(cfg, engine, plan.model.num_hidden_layers, rank, world, device)
    facts = RunFacts(world, saved.step if saved else None, link.verdict, link.nodes, preflight,
                     engine.num_params, engine.plan, inputs.waited_for_workers_s, engine.load,
                     LinkShares(**probe), marks)
    hooks = FaultHooks.for_rank(cfg, resumed=saved is not None, rank=rank, world=world)
    Trainer(cfg, engine, batch_at, state, schedule, facts, rank, inputs.run_started_at,
            evaluator, hooks).train()


def _probe_link(cfg: TrainConfig, engine, layers: int, rank: int, world: int,
                device: torch.device) -> dict:
    """The warm-up link probe and, with --efa-floor-gbps, its check against the floor (stops
    the run with --strict-efa; rank 0 warns otherwise), timed: it must stay cheap."""
    started = time.monotonic()
    probe = bandwidth.probe(engine.mesh, device)
    if cfg.efa_floor_gbps is None:
        return probe
    p = engine.plan
    step = StepPlan(engine.num_params, layers, p.replicas, world // p.replicas, p.reduce_dtype,
                    not p.reshard_after_forward, p.micro_batch_size, p.grad_accum, cfg.seq_len,
                    p.activation_checkpointing,
                    trainable=engine.trainable_params if engine.lora else None,
                    replicated_base=p.replicate_base)
    verdict = link_floor.check(probe, step, cfg.efa_floor_gbps, cfg.strict_efa,
                               engine.flops_per_token, device)
    if rank == 0:
        took = time.monotonic() - started
        print(f"WARNING: {verdict.message()}" if verdict.below else
              f"link floor: {verdict.describe()}, checked in {took:.2f} s", flush=True)
    return probe


def _check_network(cfg: TrainConfig, rank: int, device: torch.device):
    """The EFA preflight and the transport NCCL chose (stops the run when it is not the expected
    one and --on-fallback fail); rank 0 warns of a fallback."""
    log_path = transport.capture_nccl_log(rank)
    preflight = _preflight(cfg)
    link = transport.check_transport(log_path, device, cfg.expect_transport, cfg.on_fallback)
    if rank == 0 and link.message:
        print(f"WARNING: {link.message}", flush=True)
    return link, preflight


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
