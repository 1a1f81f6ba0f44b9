"""What one attempt knows about itself, typed: the run's facts (fixed at set-up, a few filled in as
the loop reaches them) and the metrics row of a log point. The summary is built from the two
(handoff.RunSummary.from_run); the row alone goes to metrics.csv, the tracker and Ray Train, so
a fact is never mistaken for a metric. Standard library only: handoff.py imports it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training.step.engine import Load, Plan


@dataclass
class LinkShares:
    """Is the link the bottleneck? The warm-up bus bandwidths (network/bandwidth.probe) and, once
    the attempt's second step is profiled, the shares of that step spent communicating
    (network/device_time.profile_step; none off GPU). Mutable: the profile comes later."""
    allgather_busbw_gbps: float | None = None
    allreduce_busbw_gbps: float | None = None
    comm_share: float | None = None
    exposed_comm_share: float | None = None
    profiled_step_ms: float | None = None

    def update(self, measured: dict[str, float | None]) -> None:
        """Take a measurement whose keys are these fields (probe's, profile_step's)."""
        for key, value in measured.items():
            setattr(self, key, value)

    def to_dict(self) -> dict[str, float | None]:
        return dataclasses.asdict(self)


@dataclass
class RunFacts:
    """The facts of one attempt: how it is laid out and connected, where it resumed, what its
    start cost. Mutable on purpose, and only where the loop learns something later: the link's
    profiled shares, the time to the first step and the first step's cold-start mark."""
    world_size: int
    resumed_from_step: int | None
    nccl_transport: str
    nccl_nodes: int | None
    efa_preflight: str
    num_params: int
    plan: Plan
    waited_for_workers_s: float | None
    load: Load | None = None
    link: LinkShares = field(default_factory=LinkShares)
    # Wall clock: the cold-start timeline's milestones (train_started, nccl_ready, ...), by name.
    cold_start_marks: dict[str, float] = field(default_factory=dict)
    time_to_first_step_s: float | None = None

    def first_step_done(self, now: float, run_started_at: float | None) -> None:
        """The attempt's first step is logged: its cold-start mark and, when the run's start is
        known (it began on another node: wall clock), the time to it."""
        self.cold_start_marks["first_step"] = now
        if run_started_at is not None:
            self.time_to_first_step_s = now - run_started_at


@dataclass(frozen=True)
class MetricsRow:
    """One log point's metrics (a metrics.csv row, a tracker step, a Ray Train report). Only
    `step` is always there: the evaluation before the first step is a row of its own."""
    step: int
    loss: float | None = None
    first_loss: float | None = None  # the run's first step, across resumes
    lr: float | None = None
    grad_norm: float | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None  # this log window's
    tokens_per_s_per_worker: float | None = None
    mfu: float | None = None
    peak_mem_gib: float | None = None
    run_tokens_per_s: float | None = None  # the attempt's, first step and saves left out
    run_tokens_per_s_with_checkpoints: float | None = None
    first_eval_loss: float | None = None
    eval_loss: float | None = None  # when this log point evaluated
    # --objective dpo: model/rewards.py's REWARD_METRICS (means over the log window's pairs) and, when this log
    # point evaluated, EVAL_REWARD_METRICS; empty for SFT
    preference: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The row as its consumers take it (csv.DictWriter, MLflow's metrics, ray.train.report);
        each reads the fields it knows and skips what has no value. The preference metrics are
        keys of their own, under TRL's names."""
        out = dataclasses.asdict(self)
        out.update(out.pop("preference"))
        return out
