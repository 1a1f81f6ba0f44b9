"""`train_func`: what every Ray Train worker runs.

Orchestrates small helpers: transport guard, model and optimizer, resume, the step loop with
progress, metrics and checkpoints, and the optional export.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Callable

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from training.network import bandwidth, device_time, transport
from training.run import checkpoint, export, tracking
from training.config import RANDOM_DATA, TrainConfig
from training.data.packing import Batch, Samples
from training.data.random_tokens import random_batch
from training.step.engine import Engine, build_engine, mean_across_ranks, train_step
from training.run.evaluate import Evaluator, perplexity
from training.step.metrics import mfu, peak_flops
from training.model.model import model_config
from training.driver.ray_setup import worker_context
from training.run.run_files import RunFiles
from training.step.schedule import Schedule, resume_schedule


def train_func(loop_config: dict) -> None:
    cfg = TrainConfig(**loop_config["train"])
    rank, world, _, device = worker_context()
    marks = {"train_started": time.time()}  # wall clock: the cold-start timeline's milestones

    log_path = transport.capture_nccl_log(rank)
    preflight = _preflight(cfg)
    link = transport.check_transport(log_path, device, cfg.expect_transport, cfg.on_fallback)
    marks["nccl_ready"] = time.time()
    if rank == 0 and link.message:
        print(f"WARNING: {link.message}", flush=True)

    engine = build_engine(cfg, model_config(cfg.model, loop_config.get("vocab_size")), device)
    # --tokens-per-step: the engine's planner chose micro-batch and accumulation to fit memory.
    cfg = dataclasses.replace(cfg, micro_batch_size=engine.plan.micro_batch_size,
                              grad_accum=engine.plan.grad_accum)
    tokens = loop_config.get("tokens")  # training.data.prepare.DataPlan.build: what to read
    saved = checkpoint.resume(engine)
    state, schedule, notes = start_state(cfg, saved, tokens["fingerprint"] if tokens else cfg.data)
    for note in notes if rank == 0 else ():
        print(f"WARNING: {note}", flush=True)
    if rank == 0 and engine.load:
        print(f"load: {engine.load['load_s']:.1f} s, peak host RSS per rank (GiB) "
              f"{engine.load['load_host_rss_gib']}", flush=True)

    batch_at = _batches(cfg, rank, world, loop_config.get("vocab_size") or
                        engine.model.lm.config.vocab_size, tokens)
    marks["model_ready"] = time.time()
    info = {"world_size": world, "resumed_from_step": saved.step if saved else None,
            "nccl_transport": link.verdict, "nccl_nodes": link.nodes, "efa_preflight": preflight,
            "num_params": engine.num_params, "cold_start_marks": marks,
            "waited_for_workers_s": loop_config.get("waited_for_workers_s"),
            "time_to_first_step_s": None, **dataclasses.asdict(engine.plan), **engine.load,
            **bandwidth.probe(engine.mesh, device)}
    evaluator = Evaluator.for_run(RunFiles.from_context().fs, tokens and tokens["eval"], cfg,
                                  rank, world)
    _run_steps(cfg, engine, batch_at, state, schedule, info, rank,
               loop_config.get("run_started_at"), evaluator)


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
            "its data position does not apply; use the same --data, --tokenizer and --seq-len, "
            "or a new --name")
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


BatchAt = Callable[[int, int, int], Batch | tuple[torch.Tensor, torch.Tensor]]


def _batches(cfg: TrainConfig, rank: int, world: int, vocab: int, tokens: dict | None) -> BatchAt:
    """(step, samples seen before it, micro-batch index) -> this rank's micro-batch."""
    if cfg.data in RANDOM_DATA:
        return lambda step, _seen, micro: random_batch(
            seed=cfg.seed, rank=rank, step=step, micro=micro, batch=cfg.micro_batch_size,
            seq_len=cfg.seq_len, vocab=vocab, repeat=cfg.data == "repeat")
    samples = Samples(RunFiles.from_context().fs, tokens["directory"])
    return lambda _step, seen, micro: samples.batch(seen, rank=rank, world=world, micro=micro,
                                                   batch=cfg.micro_batch_size)


class _Clock:
    """Step times between log points, checkpoint saves left out. The run's first step carries
    warm-up (allocator, NCCL connections), so the compute rate leaves it out; the wall rate keeps
    everything since the attempt's first step began, saves included."""

    def __init__(self, tokens_per_step: int):
        self.tokens_per_step = tokens_per_step
        self.timed_time, self.timed_steps = 0.0, 0
        self.started, self.steps = time.perf_counter(), 0
        self.restart()

    def restart(self) -> None:
        self.window_start, self.window_steps = time.perf_counter(), 0

    def tick(self) -> None:
        """One more step in this window."""
        self.window_steps += 1
        self.steps += 1

    def lap(self, untimed: bool) -> float:
        """Seconds per step since the last lap (call after a device sync); an `untimed` window
        (the first step's warm-up, the profiled step) stays out of the run's rate."""
        elapsed = time.perf_counter() - self.window_start
        if not untimed:
            self.timed_time += elapsed
            self.timed_steps += self.window_steps
        return elapsed / self.window_steps

    def run_rate(self, fallback: float) -> float:
        return self.tokens_per_step * self.timed_steps / self.timed_time if self.timed_steps \
            else fallback

    def wall_rate(self) -> float:
        return self.tokens_per_step * self.steps / (time.perf_counter() - self.started)


class NonFiniteError(RuntimeError):
    """The loss or gradient norm stopped being finite; nothing after it is saved."""


class _NonFiniteGuard:
    """Records, on the device and without a sync, the first step whose loss or gradient norm is
    not finite; `check` (at log and save points, which sync anyway) stops the run on every rank
    before anything from that step on is saved."""

    NONE = 2**62

    def __init__(self, device: torch.device):
        self.first_bad = torch.full((), self.NONE, dtype=torch.int64, device=device)

    def observe(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        # A Python scalar bound: no host-to-device copy, so no sync (unlike torch.tensor(step)).
        self.first_bad = torch.where(bad, self.first_bad.clamp(max=step), self.first_bad)

    def check(self, saved_step: int | None) -> None:
        first = self.first_bad.clone()
        if dist.is_initialized():
            dist.all_reduce(first, op=dist.ReduceOp.MIN)
        if int(first) != self.NONE:
            where = f"checkpoint step {saved_step}" if saved_step else "no checkpoint yet"
            raise NonFiniteError(
                f"the loss or gradient norm is not finite at step {int(first)}; stopped without "
                f"saving (the newest complete checkpoint: {where}); lower --lr, raise "
                "--warmup-steps or set --grad-clip, then rerun")


def _inject_fault(cfg: TrainConfig, step: int, info: dict, rank: int,
                  saver: checkpoint.Saver) -> None:
    """Test hooks: the last rank dies once, in a fresh run, at the end of that step with no grace
    period: --fault-at-step right after its checkpoint completed (when it saves one),
    --fault-in-save-at-step while its asynchronous checkpoint is still in flight."""
    if cfg.fault_at_step == step:
        saver.wait()  # collective: every rank completes the save first
    if step in (cfg.fault_at_step, cfg.fault_in_save_at_step) \
            and info["resumed_from_step"] is None and rank == info["world_size"] - 1:
        os._exit(17)


def _poison(engine: Engine) -> None:
    """Test hook (--nan-at-step): turn one weight shard into NaN, as a diverging run would."""
    with torch.no_grad():
        p = next(engine.model.parameters())
        (p.to_local() if isinstance(p, DTensor) else p).fill_(float("nan"))


def _run_steps(cfg: TrainConfig, engine: Engine, batch_at: BatchAt, state: checkpoint.RunState,
               schedule: Schedule, info: dict, rank: int, run_started_at: float | None,
               evaluator: Evaluator | None = None) -> None:
    world = info["world_size"]
    on_gpu = engine.device.type == "cuda"
    peak = peak_flops(torch.cuda.get_device_name(engine.device) if on_gpu else None)
    files = RunFiles.from_context() if rank == 0 else None
    tracker = tracking.start(cfg.mlflow_tracking_uri, files, cfg.name,
                             {**cfg.to_dict(), **dataclasses.asdict(engine.plan)})
    clock = _Clock(cfg.tokens_per_step_per_worker * world)
    guard = _NonFiniteGuard(engine.device)
    pending: list[dict] = []  # metrics rows not yet in metrics.csv
    saved_step = info["resumed_from_step"]
    if evaluator and state.step == 0:  # before the first step: what training starts from
        first_eval = evaluator.loss(engine)
        state = dataclasses.replace(state, first_eval_loss=first_eval)
        pending.append({"step": 0, "eval_loss": first_eval})
        if rank == 0:
            print(f"step 0/{cfg.steps}  eval loss {first_eval:.4f}  "
                  f"perplexity {perplexity(first_eval):.2f}", flush=True)
    last: dict = {"step": state.step, "first_loss": state.first_loss, **info}  # if no step runs
    first_step = state.step + 1
    untimed = True  # the window holds the first step (warm-up) or the profiled one
    saver = checkpoint.Saver(cfg.async_checkpoint and bool(cfg.checkpoint_every))
    for step in range(first_step, cfg.steps + 1):
        micro = [batch_at(step, state.samples_seen, m) for m in range(cfg.grad_accum)]
        if cfg.nan_at_step == step and info["resumed_from_step"] is None:
            _poison(engine)
        run_step = functools.partial(train_step, engine, micro, schedule.lr(step), cfg.grad_clip)
        if step == first_step + 1:  # warm (compiled, connected): where one step's time goes
            loss, shares = device_time.profile_step(run_step, engine.device)
            info.update(shares)
            untimed = True
            if rank == 0:
                print(device_time.link_report(info), flush=True)
        else:
            loss = run_step()
        guard.observe(step, loss, engine.grad_norm)
        state = dataclasses.replace(state, step=step, samples_seen=state.samples_seen +
                                    world * cfg.grad_accum * cfg.micro_batch_size)
        clock.tick()
        save = bool(cfg.checkpoint_every) and (step == cfg.steps or step % cfg.checkpoint_every == 0)
        evaluate = evaluator is not None and evaluator.due(step)
        if save or evaluate or step in (first_step, cfg.steps) or step % cfg.log_every == 0:
            try:
                guard.check(saved_step)
            except NonFiniteError as e:  # every rank: the check is collective
                # Not a worker failure: a retry would replay the same samples at the same
                # learning rate into the same divergence, so the run ends here and says why.
                saver.wait()  # a save in flight is of a good step
                _finish(cfg, engine, files, tracker, {**last, "stopped": str(e)}, pending)
                return
            loss_value = mean_across_ranks(loss)  # syncs the device, so the clock is honest
            if step == first_step and run_started_at is not None:  # wall clock: the run began
                info["time_to_first_step_s"] = time.time() - run_started_at  # on another node
            if step == first_step:
                info["cold_start_marks"]["first_step"] = time.time()
            step_time = clock.lap(untimed=untimed)
            tps = clock.tokens_per_step / step_time
            evaluated = {"eval_loss": evaluator.loss(engine)} if evaluate else {}
            if state.first_loss is None:
                state = dataclasses.replace(state, first_loss=loss_value)
            metrics = last = {
                "step": step, "loss": loss_value, "first_loss": state.first_loss,
                "lr": schedule.lr(step), "grad_norm": float(engine.grad_norm),
                "step_time_s": step_time, "tokens_per_s": tps, "tokens_per_s_per_worker": tps / world,
                "mfu": mfu(tps / world, engine.flops_per_token, peak),
                "peak_mem_gib": torch.cuda.max_memory_allocated(engine.device) / 2**30 if on_gpu
                else None,
                "run_tokens_per_s": clock.run_rate(fallback=tps),
                "run_tokens_per_s_with_checkpoints": clock.wall_rate(),
                "first_eval_loss": state.first_eval_loss, **evaluated,
                **info,
            }
            pending.append(metrics)
            tracker.log({k: v for k, v in metrics.items() if k not in info}, step)
            if rank == 0:
                mfu_text = f"  mfu {metrics['mfu']:.3f}" if metrics["mfu"] is not None else ""
                eval_text = (f"  eval loss {evaluated['eval_loss']:.4f}  perplexity "
                             f"{perplexity(evaluated['eval_loss']):.2f}" if evaluated else "")
                print(f"step {step}/{cfg.steps}  loss {loss_value:.4f}  lr {metrics['lr']:.2e}  "
                      f"tokens/s {tps:,.0f}{mfu_text}{eval_text}", flush=True)
            if save:
                if files:
                    files.append_metrics(pending)
                    pending = []
                saver.save(engine, state, metrics)
                saved_step = step
            else:
                ray.train.report(metrics)
            clock.restart()
            untimed = False
        _inject_fault(cfg, step, info, rank, saver)
    saver.wait()
    _finish(cfg, engine, files, tracker, last, pending)


def _finish(cfg: TrainConfig, engine: Engine, files: RunFiles | None, tracker: tracking.Tracker,
            last: dict, pending: list[dict]) -> None:
    """Collective: the run's last files. Only a run that did not stop early is exported; the
    summary goes to the tracker (with the plot and the export's path) before it is written."""
    stopped = last.get("stopped")
    path = export.export(engine, cfg, files) if cfg.export and not stopped else None
    if files is None:
        return
    files.append_metrics(pending)
    files.plot()
    summary = {**last, "export_path": path}
    tracker.finish({"summary.json": json.dumps(summary).encode(),
                    "metrics.png": files.read_bytes("metrics.png")},
                   {"export_path": path} if path else {}, failed=bool(stopped))
    files.write_json("summary.json", {**summary, **tracker.summary()})
