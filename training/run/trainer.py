"""One attempt's step loop, as named steps the way torchtitan's `Trainer.train` reads
(torchtitan/train.py): step, and at log points check, log (with the evaluation), then save or
report; the run's last files at the end. A preemption notice makes a step a log point whose
save is synchronous (training/run/preemption.py). The test hooks are called at named points."""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable

import torch

from training.config import TrainConfig
from training.data.packing import Batch
from training.evals import after_export
from training.network import device_time
from training.run import checkpoint, export, rng, tracking
from training.run.evaluate import Evaluator, perplexity
from training.run.facts import MetricsRow, RunFacts
from training.run.handoff import SUMMARY_FILE, RunSummary
from training.run.hooks import FaultHooks
from training.run.preemption import Notice, Preemptions
from training.run.progress import NonFiniteError, NonFiniteGuard, StepClock
from training.run.run_files import RunFiles
from training.run.untrained import UntrainedSteps, warning
from training.step.engine import Engine, mean_across_ranks, train_step
from training.step.metrics import mfu, peak_flops
from training.step.schedule import Schedule

BatchAt = Callable[[int, int, int], Batch | tuple[torch.Tensor, torch.Tensor]]
"""(step, samples seen before it, micro-batch index) -> this rank's micro-batch."""


class Trainer:
    """The loop's state between steps: the run state, the run's facts, the clock, the guard, the
    metrics rows not yet in metrics.csv, the saver, and (rank 0) the run files and the
    tracker."""

    def __init__(self, cfg: TrainConfig, engine: Engine, batch_at: BatchAt,
                 state: checkpoint.RunState, schedule: Schedule, facts: RunFacts, rank: int,
                 run_started_at: float | None, evaluator: Evaluator | None, hooks: FaultHooks):
        self.cfg, self.engine, self.batch_at, self.hooks = cfg, engine, batch_at, hooks
        self.state, self.schedule, self.facts, self.rank = state, schedule, facts, rank
        self.run_started_at, self.evaluator = run_started_at, evaluator
        self.batch, self.world = engine.plan.batch, facts.world_size
        on_gpu = engine.device.type == "cuda"
        self.peak = peak_flops(torch.cuda.get_device_name(engine.device) if on_gpu else None)
        self.files = RunFiles.from_context() if rank == 0 else None
        self.tracker = tracking.start(cfg.mlflow_tracking_uri, self.files, cfg.name,
                                      {**cfg.to_dict(), **dataclasses.asdict(engine.plan)})
        # real tokens: a DPO row's end-of-row padding is not counted (model/dpo.py real_share)
        real = getattr(engine.objective, "real_share", 1.0)
        self.clock = StepClock(round(self.batch.tokens_per_step(cfg.sample_tokens, self.world)
                                     * real))
        self.guard = NonFiniteGuard(engine.device)
        self.untrained = UntrainedSteps(engine.device)
        self.pending: list[MetricsRow] = []  # not yet in metrics.csv
        self.saved_step = facts.resumed_from_step
        self.saver = checkpoint.Saver(cfg.async_checkpoint and bool(cfg.checkpoint_every))
        self.last = MetricsRow(step=state.step, first_loss=state.first_loss)  # no step yet
        self.untimed = True  # the window holds the first step (warm-up) or the profiled one
        self.preemptions = Preemptions(bool(cfg.checkpoint_every), rank)

    def train(self) -> None:
        cfg = self.cfg
        if self.evaluator and self.state.step == 0:  # before the first step: what training
            self.evaluate_first()                    # starts from
        first = self.state.step + 1
        for step in range(first, cfg.steps + 1):
            self.hooks.before_step(step, self.engine)
            loss = self.step(step, profile=step == first + 1)
            notice = self.preemptions.poll()  # collective, no device sync
            save = bool(cfg.checkpoint_every) and (step == cfg.steps or
                                                   step % cfg.checkpoint_every == 0)
            # At a notice the emergency save comes first: the deadline is not the evaluation's.
            evaluate = self.evaluator is not None and self.evaluator.due(step) and not notice
            if save or evaluate or notice or step in (first, cfg.steps) or \
                    step % cfg.log_every == 0:
                if (stopped := self.check()) is not None:
                    self.finish(stopped)
                    return
                row = self.log(step, loss, first=step == first, evaluate=evaluate)
                # No ray.train.report without a checkpoint: each call is a barrier through Ray
                # Train's synchronization actor plus a hand-off to the controller (ray 2.58
                # train/v2/_internal/execution/context.py TrainContext.report), about 1.8 s on
                # 2 cores; the rows go to metrics.csv and the tracker instead.
                if notice:
                    self.save_for(notice, step, row)
                elif save:
                    self.save(step, row)
                self.clock.restart()
                self.untimed = False
            self.hooks.after_step(step, self.saver)
            if self.hooks.holds(step):
                self.hold(step)
        self.saver.wait()
        self.finish()

    def evaluate_first(self) -> None:
        first_eval = self.evaluator.loss(self.engine)
        self.state = dataclasses.replace(self.state, first_eval_loss=first_eval)
        self.pending.append(MetricsRow(step=0, eval_loss=first_eval,
                                       preference=self._preference(evaluated=True)))
        if self.rank == 0:
            ppl = "" if self.engine.objective else f"  perplexity {perplexity(first_eval):.2f}"
            print(f"step 0/{self.cfg.steps}  eval loss {first_eval:.4f}{ppl}", flush=True)

    def step(self, step: int, profile: bool) -> torch.Tensor:
        """One optimizer step (no sync); `profile`: the second step of the attempt, warm
        (compiled, connected), is profiled for where one step's time goes."""
        micro = [self.batch_at(step, self.state.samples_seen, m)
                 for m in range(self.batch.grad_accum)]
        rng.seed_step(self.cfg.seed, step, self.rank)  # dropout: the same draws on a resume
        self.untrained.observe(step, micro)
        run_step = functools.partial(train_step, self.engine, micro, self.schedule.lr(step),
                                     self.cfg.grad_clip)
        if profile:
            loss, shares = device_time.profile_step(run_step, self.engine.device)
            self.facts.link.update(shares)
            self.untimed = True
            if self.rank == 0:
                print(device_time.link_report(self.facts.link.to_dict()), flush=True)
        else:
            loss = run_step()
        self.guard.observe(step, loss, self.engine.grad_norm)
        self.state = dataclasses.replace(self.state, step=step, samples_seen=(
            self.state.samples_seen + self.batch.samples_per_step(self.world)))
        self.clock.tick()
        return loss

    def check(self) -> str | None:
        """Collective: why the run stops (a non-finite loss or gradient norm), or None."""
        try:
            self.guard.check(self.saved_step)
        except NonFiniteError as e:  # every rank: the check is collective
            # Not a worker failure: a retry would replay the same samples at the same
            # learning rate into the same divergence, so the run ends here and says why.
            self.saver.wait()  # a save in flight is of a good step
            return str(e)
        return None

    def log(self, step: int, loss: torch.Tensor, *, first: bool, evaluate: bool) -> MetricsRow:
        """The step's metrics row (evaluated when due): kept for metrics.csv, tracked, printed."""
        loss_value = mean_across_ranks(loss)  # syncs the device, so the clock is honest
        if first:  # wall clock: the run began on another node
            self.facts.first_step_done(time.time(), self.run_started_at)
        step_time = self.clock.lap(untimed=self.untimed)
        if (untrained := self.untrained.collect()) and self.rank == 0:
            print(warning(untrained, self.cfg.seq_len), flush=True)
        eval_loss = self.evaluator.loss(self.engine) if evaluate else None
        if self.state.first_loss is None:
            self.state = dataclasses.replace(self.state, first_loss=loss_value)
        row = self.last = dataclasses.replace(
            self._row(step, loss_value, step_time, eval_loss),
            preference=self._preference(evaluated=evaluate))
        self.pending.append(row)
        self.tracker.log(row.to_dict(), step)
        if self.rank == 0:
            print(_progress_line(row, self.cfg.steps), flush=True)
        return row

    def _preference(self, evaluated: bool) -> dict[str, float]:
        """Collective. --objective dpo: TRL's reward metrics of the pairs trained since the last
        log point (then counted afresh) and of the evaluation just run; {} for SFT."""
        objective, out = self.engine.objective, {}
        if objective is not None and objective.stats.sums is not None:
            out = objective.stats.means()
            objective.stats = type(objective.stats)()
        if evaluated and getattr(self.evaluator, "metrics", None):
            out.update(self.evaluator.metrics)
        return out

    def _row(self, step: int, loss_value: float, step_time: float,
             eval_loss: float | None) -> MetricsRow:
        tps, device = self.clock.tokens_per_step / step_time, self.engine.device
        return MetricsRow(
            step=step, loss=loss_value, first_loss=self.state.first_loss,
            lr=self.schedule.lr(step), grad_norm=float(self.engine.grad_norm),
            step_time_s=step_time, tokens_per_s=tps, tokens_per_s_per_worker=tps / self.world,
            mfu=mfu(tps / self.world, self.engine.flops_per_token, self.peak),
            peak_mem_gib=torch.cuda.max_memory_allocated(device) / 2**30
            if device.type == "cuda" else None,
            run_tokens_per_s=self.clock.run_rate(fallback=tps),
            run_tokens_per_s_with_checkpoints=self.clock.wall_rate(),
            first_eval_loss=self.state.first_eval_loss, eval_loss=eval_loss)

    def save(self, step: int, row: MetricsRow, now: bool = False) -> None:
        """Collective: this step's checkpoint (`now`: complete before returning)."""
        if self.files:
            self.files.append_metrics(self.pending)
            self.pending = []
        if self.hooks.stalls(step):
            self.saver.stall_next_upload()
        (self.saver.save_now if now else self.saver.save)(self.engine, self.state, row.to_dict())
        self.saved_step = step

    def save_for(self, notice: Notice, step: int, row: MetricsRow) -> None:
        """Collective: a preemption's checkpoint of this step, then Ray Train is told to restart
        the workers from it; training goes on until it does (or the run ends first)."""
        self.preemptions.save(notice, functools.partial(self.save, step, row, now=True), step)

    def hold(self, step: int, polls: int = 1500) -> None:
        """Test hook (--hold-at-step): wait at this step for a preemption notice (every rank
        polls in step), save for it, then wait (at most `polls` x 0.2 s) for Ray Train to stop
        this attempt."""
        for _ in range(polls):
            if notice := self.preemptions.poll():
                self.save_for(notice, step, self.last)
            time.sleep(0.2)
        raise RuntimeError(f"--hold-at-step {step}: no preemption came")

    def finish(self, stopped: str | None = None) -> None:
        """Collective: the run's last files. Only a run that did not stop early (`stopped`: why
        it did) is exported; the summary goes to the tracker (with the plot and the export's
        path) before it is written."""
        path = export.export(self.engine, self.cfg, self.files) \
            if self.cfg.export and not stopped else None
        evaluated = after_export.run(self.cfg, path, self.engine.device, self.files) \
            if self.cfg.export and not stopped else None  # collective; never fails the run
        if self.files is None:
            return
        saved = self.files.read_json(SUMMARY_FILE)
        if self.state.step == self.facts.resumed_from_step and saved:  # a finished run's export
            self.files.write_json(SUMMARY_FILE, {**saved, "export_path": path})  # no step ran
            return
        self.files.append_metrics(self.pending)
        self.files.plot()
        summary = RunSummary.from_run(self.facts, self.last, stopped=stopped, export_path=path)
        if evaluated:
            print("\n".join(evaluated.log), flush=True)
            self.tracker.log(evaluated.metrics(), self.last.step)
            summary = dataclasses.replace(summary, **evaluated.summary_fields())
        self.tracker.finish({SUMMARY_FILE: summary.to_json().encode(),
                             "metrics.png": self.files.read_bytes("metrics.png")},
                            {"export_path": path} if path else {}, failed=bool(stopped))
        self.files.write_json(SUMMARY_FILE, dataclasses.replace(
            summary, **self.tracker.summary()).to_dict())


def _progress_line(row: MetricsRow, steps: int) -> str:
    mfu_text = f"  mfu {row.mfu:.3f}" if row.mfu is not None else ""
    ppl = "" if row.preference else f"  perplexity {perplexity(row.eval_loss or 0):.2f}"
    eval_text = f"  eval loss {row.eval_loss:.4f}{ppl}" if row.eval_loss is not None else ""
    rewards = "".join(f"  {k} {v:.4f}" for k, v in row.preference.items()
                      if k.endswith(("accuracies", "margins")))
    # Two rates, each named: the steps' own (since the last log point, logging and saves left
    # out) and the attempt's overall (everything since its first step began).
    return (f"step {row.step}/{steps}  loss {row.loss:.4f}  lr {row.lr:.2e}  "
            f"tokens/s {row.tokens_per_s:,.0f} in steps, "
            f"{row.run_tokens_per_s_with_checkpoints:,.0f} overall{mfu_text}{eval_text}{rewards}")
