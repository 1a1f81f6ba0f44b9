"""`train_func`: what every Ray Train worker runs.

Orchestrates small helpers: transport guard, model and optimizer, resume, the step loop with
progress, metrics and checkpoints, and the optional export.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Iterator

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from training import bandwidth, checkpoint, data, device_time, transport
from training.config import TrainConfig
from training.engine import Engine, build_engine, lr_at, mean_across_ranks, train_step
from training.metrics import mfu, peak_flops
from training.model import is_builtin, model_config
from training.ray_setup import worker_context
from training.run_files import RunFiles


def train_func(loop_config: dict) -> None:
    cfg = TrainConfig(**loop_config["train"])
    rank, world, local_rank, device = worker_context()

    log_path = transport.capture_nccl_log(rank)
    preflight = _preflight(cfg)
    link = transport.check_transport(log_path, device, cfg.expect_transport, cfg.on_fallback)
    if rank == 0 and link.message:
        print(f"WARNING: {link.message}", flush=True)

    _fetch_weights_once_per_node(cfg.model, local_rank)
    engine = build_engine(cfg, model_config(cfg.model, loop_config.get("vocab_size")), device)
    # --tokens-per-step: the engine's planner chose micro-batch and accumulation to fit memory.
    cfg = dataclasses.replace(cfg, micro_batch_size=engine.plan.micro_batch_size,
                              grad_accum=engine.plan.grad_accum)
    position = checkpoint.Position(step=0, data_position=0)
    resumed_from = None
    if (ckpt := ray.train.get_checkpoint()) is not None:
        position = checkpoint.load(ckpt, engine)
        resumed_from = position.step

    batches = _batches(cfg, rank, loop_config.get("vocab_size") or
                       engine.model.lm.config.vocab_size, position)
    info = {"world_size": world, "resumed_from_step": resumed_from, "nccl_transport": link.verdict,
            "nccl_nodes": link.nodes, "efa_preflight": preflight, "num_params": engine.num_params,
            "waited_for_workers_s": loop_config.get("waited_for_workers_s"),
            "time_to_first_step_s": None, **dataclasses.asdict(engine.plan),
            **bandwidth.probe(engine.mesh, device)}
    _run_steps(cfg, engine, batches, position, info, rank, loop_config.get("run_started_at"))


def _preflight(cfg: TrainConfig) -> str:
    """EFA checks where EFA is expected or present; skipped cleanly off AWS."""
    if cfg.expect_transport != "efa" and not os.path.exists("/dev/infiniband"):
        return "skipped: no EFA device here"
    problems = transport.efa_preflight()
    if problems and cfg.expect_transport == "efa" and cfg.on_fallback == "fail":
        raise transport.TransportError("EFA preflight failed: " + "; ".join(problems))
    return "ok" if not problems else "failed: " + "; ".join(problems)


def _fetch_weights_once_per_node(spec: str, local_rank: int) -> None:
    """Local rank 0 downloads pretrained weights into the node's cache while the others wait."""
    if is_builtin(spec) or os.path.isdir(spec):
        return
    if local_rank == 0:
        from huggingface_hub import snapshot_download

        snapshot_download(spec, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
    dist.barrier()


def _batches(cfg: TrainConfig, rank: int, vocab: int,
             position: checkpoint.Position) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if cfg.data in data.RANDOM_MODES:
        def gen():
            step = position.step
            while True:
                step += 1
                for micro in range(cfg.grad_accum):
                    yield data.random_batch(seed=cfg.seed, rank=rank, step=step, micro=micro,
                                            batch=cfg.micro_batch_size, seq_len=cfg.seq_len,
                                            vocab=vocab, repeat=cfg.data == "repeat")
        return gen()
    return data.text_batches(ray.train.get_dataset_shard("train"), cfg.micro_batch_size,
                             skip=position.data_position)


class _Clock:
    """Step times between log points. The run's first step carries warm-up (allocator, NCCL
    connections), so the run's average rate leaves it out."""

    def __init__(self, tokens_per_step: int):
        self.tokens_per_step = tokens_per_step
        self.timed_time, self.timed_steps = 0.0, 0
        self.restart()

    def restart(self) -> None:
        self.window_start, self.window_steps = time.perf_counter(), 0

    def tick(self) -> None:
        """One more step in this window."""
        self.window_steps += 1

    def lap(self, includes_first_step: bool) -> float:
        """Seconds per step since the last lap (call after a device sync)."""
        elapsed = time.perf_counter() - self.window_start
        if not includes_first_step:
            self.timed_time += elapsed
            self.timed_steps += self.window_steps
        return elapsed / self.window_steps

    def run_rate(self, fallback: float) -> float:
        return self.tokens_per_step * self.timed_steps / self.timed_time if self.timed_steps \
            else fallback


def _inject_fault(cfg: TrainConfig, step: int, info: dict, rank: int) -> None:
    """Test hook (--fault-at-step): the last rank dies once, in a fresh run. The pause lets Ray
    Train's controller (it polls every 2 s) register the last checkpoint first, as it would have
    long before any real failure."""
    if cfg.fault_at_step == step and info["resumed_from_step"] is None \
            and rank == info["world_size"] - 1:
        time.sleep(5)
        os._exit(17)


def _run_steps(cfg: TrainConfig, engine: Engine, batches, position: checkpoint.Position,
               info: dict, rank: int, run_started_at: float | None) -> None:
    world = info["world_size"]
    on_gpu = engine.device.type == "cuda"
    peak = peak_flops(torch.cuda.get_device_name(engine.device) if on_gpu else None)
    files = RunFiles.from_context() if rank == 0 else None
    clock = _Clock(cfg.tokens_per_step_per_worker * world)
    pending: list[dict] = []  # metrics rows not yet in metrics.csv
    first_loss: float | None = None
    last: dict = {"step": position.step, **info}  # what summary.json says if no step runs
    data_position = position.data_position
    first_step = position.step + 1
    for step in range(first_step, cfg.steps + 1):
        micro = [next(batches) for _ in range(cfg.grad_accum)]
        data_position += cfg.grad_accum
        run_step = functools.partial(train_step, engine, micro, lr_at(step, cfg), cfg.grad_clip)
        if step == first_step + 1:  # warm (compiled, connected): where one step's time goes
            loss, shares = device_time.profile_step(run_step, engine.device)
            info.update(shares)
            if rank == 0:
                print(device_time.link_report(info), flush=True)
        else:
            loss = run_step()
        clock.tick()
        _inject_fault(cfg, step, info, rank)
        save = bool(cfg.checkpoint_every) and (step == cfg.steps or step % cfg.checkpoint_every == 0)
        if not (save or step in (first_step, cfg.steps) or step % cfg.log_every == 0):
            continue
        loss_value = mean_across_ranks(loss)  # syncs the device, so the clock is honest
        if step == first_step and run_started_at is not None:  # wall clock: the run began
            info["time_to_first_step_s"] = time.time() - run_started_at  # on another node
        step_time = clock.lap(includes_first_step=step == first_step)
        tps = clock.tokens_per_step / step_time
        first_loss = loss_value if first_loss is None else first_loss
        metrics = last = {
            "step": step, "loss": loss_value, "first_loss": first_loss,
            "lr": lr_at(step, cfg), "step_time_s": step_time,
            "tokens_per_s": tps, "tokens_per_s_per_worker": tps / world,
            "mfu": mfu(tps / world, engine.flops_per_token, peak),
            "peak_mem_gib": torch.cuda.max_memory_allocated(engine.device) / 2**30 if on_gpu else None,
            "run_tokens_per_s": clock.run_rate(fallback=tps),
            **info,
        }
        pending.append(metrics)
        if rank == 0:
            mfu_text = f"  mfu {metrics['mfu']:.3f}" if metrics["mfu"] is not None else ""
            print(f"step {step}/{cfg.steps}  loss {loss_value:.4f}  lr {metrics['lr']:.2e}  "
                  f"tokens/s {tps:,.0f}{mfu_text}", flush=True)
        if save:
            if files:
                files.append_metrics(pending)
                pending = []
            checkpoint.save_and_report(engine, checkpoint.Position(step, data_position), metrics)
        else:
            ray.train.report(metrics)
        clock.restart()
    if files:
        files.append_metrics(pending)
        files.plot()
        files.write_json("summary.json", last)
    if cfg.export:
        _export(engine, files)


def _export(engine: Engine, files: RunFiles | None) -> None:
    """Consolidated Hugging Face model (full state dict gathered to rank 0) in the run directory."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(engine.model, options=StateDictOptions(full_state_dict=True,
                                                                       cpu_offload=True))
    if files is None:
        return
    state = {k.removeprefix("lm."): v for k, v in full.items()}
    with files.local_dir("hf_model") as d:
        engine.model.lm.save_pretrained(d, state_dict=state)
