"""What the driver and the workers hand each other, typed: the workers' inputs (through Ray
Train's `train_loop_config`) and the run summary (rank 0 writes it to the run directory, the
driver completes and prints it). Standard library only, so the driver imports it cheaply."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from training.config import TrainConfig
from training.data.prepare import PreparedData

SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class WorkerInputs:
    """Everything a worker needs from the driver, decided before Ray Train starts."""
    cfg: TrainConfig
    vocab_size: int | None  # the tokenizer's, for a built-in shape trained on text
    data: PreparedData | None  # None: random tokens
    run_started_at: float  # wall clock: the run's Ray cluster start (driver.cli._run_started_at)
    waited_for_workers_s: float  # from that start until every worker was there
    resumed_from_step: int | None = None  # the checkpoint the driver announced resuming from

    def as_loop_config(self) -> dict:
        """Ray Train's `train_loop_config` is a dict (TorchTrainer's signature): one entry."""
        return {"inputs": self}

    @staticmethod
    def from_loop_config(config: dict) -> "WorkerInputs":
        return config["inputs"]


@dataclass(frozen=True)
class RunSummary:
    """The job's last stdout line (`python -m training`), one key per field. Rank 0's loop fills
    what the workers know; the driver adds the data format, the checkpoint and the cold start."""
    steps: int | None = None
    first_loss: float | None = None  # the run's first step, across resumes
    last_loss: float | None = None
    data_format: str | None = None  # text, prompt-completion, messages, or random/repeat
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
    # Is the link the bottleneck? (training.network.device_time.LINK_FIELDS)
    allgather_busbw_gbps: float | None = None
    allreduce_busbw_gbps: float | None = None
    comm_share: float | None = None
    exposed_comm_share: float | None = None

    @classmethod
    def pick(cls, values: dict[str, Any]) -> "RunSummary":
        """The summary's fields out of a wider mapping (a metrics row with the run's facts)."""
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "RunSummary":
        return cls(**json.loads(text))
