"""What the driver and the workers hand each other, typed: the run plan and the workers' inputs
(through Ray Train's `train_loop_config`), and the run summary (rank 0 writes it to the run
directory, the driver completes and prints it). Standard library only, so the driver imports it
cheaply (the plan's heavier types are annotations only)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from training.config import TrainConfig
from training.data.prepare import PreparedData
from training.run.facts import MetricsRow, RunFacts

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from training.model.lora import LoraSpec
    from training.step.engine import Plan

SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class Resume:
    """The checkpoint a run resumes from, and how its saved settings continue (the driver's
    check before Ray: driver/plan.py)."""
    checkpoint: str
    step: int
    notes: list[str]


@dataclass(frozen=True)
class RunPlan:
    """The run, decided once on the driver before any worker starts (driver/plan.py): the
    settings it goes on with, the model, the data, the LoRA adapters, the resume, and the step's
    plan on the mesh the workers will form. The workers use it as given."""
    cfg: TrainConfig  # paths made absolute, --epochs' steps derived
    model: PretrainedConfig  # the shape (a built-in one takes the tokenizer's vocabulary)
    data: PreparedData | None  # None: random tokens
    lora: LoraSpec | None  # None: full fine-tuning
    num_params: int  # with the adapters, counted on the meta device
    trainable_params: int
    resume: Resume | None = None
    step: Plan | None = None  # None until placed on the workers' mesh (driver/plan.place)

    @property
    def data_id(self) -> str:
        """The data's identity in a checkpoint (a resume on other data is refused)."""
        return self.data.fingerprint if self.data else self.cfg.data

    @property
    def resumed_from_step(self) -> int | None:
        return self.resume.step if self.resume else None


@dataclass(frozen=True)
class WorkerInputs:
    """Everything a worker needs from the driver, decided before Ray Train starts."""
    plan: RunPlan  # placed: its step plan is set
    run_started_at: float  # wall clock: the run's Ray cluster start (driver.cli._run_started_at)
    waited_for_workers_s: float  # from that start until every worker was there

    def as_loop_config(self) -> dict:
        """Ray Train's `train_loop_config` is a dict (TorchTrainer's signature): one entry."""
        return {"inputs": self}

    @staticmethod
    def from_loop_config(config: dict) -> "WorkerInputs":
        return config["inputs"]


@dataclass(frozen=True)
class RunSummary:
    """The job's last stdout line (`python -m training`), one key per field. Rank 0 builds what
    the workers know (`from_run`); the driver completes it once (cli._summary) with the data
    format, the checkpoint and the cold start's phases."""
    steps: int | None = None
    first_loss: float | None = None  # the run's first step, across resumes
    last_loss: float | None = None
    data_format: str | None = None  # text, prompt-completion, messages, or random/repeat
    # rows the data's build skipped, and DPO's pairs dropped or truncated (data/prepare.py)
    data_rows: dict | None = None
    first_eval_loss: float | None = None  # before the first step
    eval_loss: float | None = None  # the last evaluation's
    tokens_per_s: float | None = None  # steps only (first step and saves left out)
    tokens_per_s_with_checkpoints: float | None = None
    mfu: float | None = None
    peak_mem_gib: float | None = None
    world_size: int | None = None
    resumed_from_step: int | None = None
    waited_for_workers_s: float | None = None
    time_to_first_step_s: float | None = None
    # The loop's milestones (wall clock); the driver turns them into the phases.
    cold_start: dict | None = None
    checkpoint: str | None = None
    checkpoint_gib: float | None = None
    run_dir: str | None = None
    nccl_transport: str | None = None
    efa_preflight: str | None = None
    stopped: str | None = None  # why the run ended early (a non-finite loss), if it did
    export_path: str | None = None  # the Hugging Face model directory, when exported
    # The code the job ran: its RayJob's code bundle digest (training.pod_contract.CODE_DIGEST_ENV);
    # None for a run started without one (a local run).
    code_digest: str | None = None
    # After the export (training/evals): lm-eval scores of base and tuned, the sample answers.
    harness: dict | None = None  # {task: {metric: {"base", "tuned", "stderr": {"base", "tuned"}}}}
    harness_s: float | None = None
    harness_nodes: int | None = None  # the GPU nodes held meanwhile (training/evals/cost.py)
    harness_gpu_node_usd: float | None = None  # their dollars for harness_s (None: no price)
    harness_error: str | None = None  # why the evaluation failed (the run did not)
    samples_path: str | None = None
    mlflow_run_id: str | None = None
    mlflow_error: str | None = None  # why tracking stopped (training went on)
    load_s: float | None = None  # pretrained weights: read on rank 0, broadcast, sharded
    load_host_rss_gib: list | None = None  # peak host RSS per rank after it
    # What the defaults chose (training.step.engine.Plan's fields).
    activation_checkpointing: bool | None = None
    reshard_after_forward: bool | None = None
    compile: bool | None = None
    micro_batch_size: int | None = None
    grad_accum: int | None = None
    mesh: str | None = None
    reduce_dtype: str | None = None
    accum_dtype: str | None = None
    loss_chunk_tokens: int | None = None  # the fused loss's chunk the plan used
    replicate_base: bool | None = None  # LoRA: the frozen base whole on each GPU
    # Is the link the bottleneck? (training.network.device_time.LINK_FIELDS)
    allgather_busbw_gbps: float | None = None
    allreduce_busbw_gbps: float | None = None
    comm_share: float | None = None
    exposed_comm_share: float | None = None
    # Drains of the run's nodes, across attempts, oldest first: time, reason (repair,
    # spot-reclaim, drained) and detail, Ray and Kubernetes nodes, step saved (head/node_events.py)
    node_events: list | None = None
    # --objective dpo: TRL's rewards/* of the last log point, and its eval_rewards/* when it
    # evaluated (model/rewards.py)
    preference: dict | None = None

    @classmethod
    def from_run(cls, facts: RunFacts, last: MetricsRow, *, stopped: str | None = None,
                 export_path: str | None = None) -> "RunSummary":
        """What the workers know, built here only (rank 0 at the run's end): the run's facts
        and its last metrics row, with the run's rates rather than the last window's."""
        link, load = facts.link, facts.load
        return cls(
            steps=last.step, first_loss=last.first_loss, last_loss=last.loss,
            first_eval_loss=last.first_eval_loss, eval_loss=last.eval_loss,
            tokens_per_s=last.run_tokens_per_s,
            tokens_per_s_with_checkpoints=last.run_tokens_per_s_with_checkpoints,
            mfu=last.mfu, peak_mem_gib=last.peak_mem_gib, world_size=facts.world_size,
            resumed_from_step=facts.resumed_from_step,
            waited_for_workers_s=facts.waited_for_workers_s,
            time_to_first_step_s=facts.time_to_first_step_s,
            cold_start=dict(facts.cold_start_marks), nccl_transport=facts.nccl_transport,
            efa_preflight=facts.efa_preflight, stopped=stopped, export_path=export_path,
            load_s=load.load_s if load else None,
            load_host_rss_gib=load.load_host_rss_gib if load else None,
            allgather_busbw_gbps=link.allgather_busbw_gbps,
            allreduce_busbw_gbps=link.allreduce_busbw_gbps, comm_share=link.comm_share,
            exposed_comm_share=link.exposed_comm_share, preference=dict(last.preference) or None,
            **dataclasses.asdict(facts.plan))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "RunSummary":
        return cls(**json.loads(text))
