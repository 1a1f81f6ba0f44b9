"""The training job's one typed configuration, parsed from the CLI and validated once.

Field docstrings are the CLI help (see `training.driver.cli`), so the flags, their defaults and their
documentation cannot drift apart. Validation collects every problem before reporting, each naming
the flag to change.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Collection, Literal

from training.errors import ConfigError

TRANSPORT_EXPECTATIONS = ("any", "efa")
REDUCE_DTYPES = ("fp32", "bf16")
FALLBACK_ACTIONS = ("fail", "warn")
LOSS_TOKENS = ("completion", "all")
ATTENTION = ("sdpa", "flex_attention")
RANDOM_DATA = ("random", "repeat")  # --data values that are not files (training.data.random_tokens)
EXPORT_DTYPES = ("bf16", "fp32")
# LoRA's default targets: the attention and MLP projections of Qwen2 (and Llama-style) layers.
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
# Why --load-in-4bit is refused (README, LoRA section).
QLORA_REFUSED = ("QLoRA (a 4-bit base) is not supported: FSDP2 with bitsandbytes 4-bit weights "
                 "has lost the quantization silently or trained to loss 0 / NaN gradient norms "
                 "(axolotl#2992, accelerate#3983), bitsandbytes is in neither the job's image "
                 "nor the benchmark machine's, and it was never measured working here; use "
                 "--lora-rank R on the bf16 base (sharded: a 7B base is 3.8 GB per GPU over "
                 "a node's 4)")



@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    model: str = field(default="tiny", metadata={"help": "built-in random-init shape (`tiny`, "
                       "`qwen2.5-1.5b`, `qwen2.5-7b`), a Hugging Face model id, or a model "
                       "directory (local or s3://bucket/prefix/, e.g. a previous run's export)"})
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer id or directory for "
                                  "--data text files, or `bytes` (UTF-8 bytes, built in); "
                                  "defaults to --model"})
    steps: int = field(default=30, metadata={"help": "optimizer steps to train (in total, across resumes)"})
    epochs: float | None = field(default=None, metadata={"help": "train this many passes over "
                                 "--data instead of --steps: the steps follow from the tokenized "
                                 "data and the batch (rounded up) and are logged; every epoch "
                                 "reads the documents in a new order seeded by --seed"})
    seq_len: int = field(default=128, metadata={"help": "tokens per sequence"})
    micro_batch_size: int = field(default=4, metadata={"help": "sequences per worker per forward pass"})
    grad_accum: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    lr: float = field(default=1e-3, metadata={"help": "peak learning rate (warmup then cosine decay)"})
    warmup_steps: int = field(default=5, metadata={"help": "linear warmup steps"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "max gradient norm (0 disables)"})
    num_workers: int = field(default=2, metadata={"help": "Ray Train workers (one per GPU on GPU clusters)"})
    use_gpu: bool | None = field(default=None, metadata={"help": "one GPU per worker; default: only "
                                 "when the Ray cluster has GPUs"})
    data: str = field(default="random", metadata={"help": "a path, an s3:// URI or a Hugging "
                      "Face Hub dataset (hf://org/name[/config][@revision][:split], default split "
                      "train) of .jsonl or .parquet files with a `text`, `prompt` + `completion`, or `messages` column "
                      "(the format is told from the columns); or `random` (fresh deterministic "
                      "random tokens each step) or `repeat` (one random batch over and over), for "
                      "transport and throughput checks only"})
    loss_tokens: Literal["completion", "all"] = field(default="completion", metadata={
        "help": "`completion`: train on completions and assistant turns only (all of `text` "
                "data); `all`: on every token"})
    eval_data: str | None = field(default=None, metadata={"help": "held-out data to evaluate "
                                  "on (same formats as --data)"})
    eval_fraction: float = field(default=0.0, metadata={"help": "hold out this fraction of "
                                 "--data's documents (a fixed choice, never trained on) to "
                                 "evaluate on; 0: none"})
    eval_every: int = field(default=0, metadata={"help": "evaluate every N steps (also before "
                            "the first step and after the last); 0: only then"})
    storage_path: str = field(default="./runs", metadata={"help": "where checkpoints and metrics go "
                              "(local directory or s3://bucket/prefix; shared storage on clusters)"})
    name: str = field(default="qwen-fsdp", metadata={"help": "run name; the same name and storage "
                      "path resume the run"})
    checkpoint_every: int = field(default=10, metadata={"help": "save a checkpoint every N steps "
                                  "and at the end; 0 disables checkpoints"})
    async_checkpoint: bool = field(default=True, metadata={"help": "save checkpoints with DCP's "
                                   "asynchronous save: training continues while they are "
                                   "written and uploaded (one in flight; host memory for one "
                                   "copy of this worker's shards)"})
    max_failures: int = field(default=0, metadata={"help": "worker failures to recover from by "
                              "restarting from the latest checkpoint"})
    max_preemptions: int = field(default=-1, metadata={"help": "node preemptions (a spot "
                                 "reclaim, a drained node, an evicted pod) to recover from, "
                                 "apart from --max-failures: each saves a checkpoint at the "
                                 "step it interrupts and resumes from it; -1: any number"})
    address: str | None = field(default=None, metadata={"help": "Ray address (`auto` on the "
                                "cluster); default starts a local Ray"})
    log_every: int = field(default=5, metadata={"help": "progress line every N steps"})
    seed: int = field(default=0, metadata={"help": "seed for init and random data"})
    activation_checkpointing: bool | None = field(default=None, metadata={"help": "recompute "
                                                  "decoder layers in backward to save memory; "
                                                  "default: on only when the memory estimate "
                                                  "exceeds the GPU (or --memory-budget-gib)"})
    memory_budget_gib: float | None = field(default=None, metadata={"help": "cap per-GPU memory "
                                            "(e.g. 22 to rehearse 24 GB L4s on a larger GPU)"})
    reshard_after_forward: bool | None = field(default=None, metadata={"help": "FSDP2: free "
                                               "gathered layer weights after forward (ZeRO-3); off "
                                               "keeps them (ZeRO-2: more memory, less communication); "
                                               "default: off when they fit without activation "
                                               "checkpointing, on otherwise"})
    attention: Literal["sdpa", "flex_attention"] = field(default="sdpa", metadata={
        "help": "attention kernel (transformers' attn_implementation); both keep packed "
                "documents apart: sdpa with a dense block mask, flex_attention with a block-sparse "
                "one"})
    loss_chunk_tokens: int = field(default=2048, metadata={"help": "tokens per chunk of the fused "
                                   "LM-head + cross-entropy (never materializes the full logits); "
                                   "0 computes full logits (for comparison only)"})
    compile: bool | None = field(default=None, metadata={"help": "torch.compile each decoder "
                                 "layer and the fused loss's chunk step; default: on with GPUs, "
                                 "off on CPU"})
    tokens_per_step: int | None = field(default=None, metadata={"help": "tokens per optimizer "
                                        "step across all workers (the global batch); the job then "
                                        "picks --micro-batch-size and --grad-accum to fit GPU memory "
                                        "and reports both; must be a multiple of --seq-len x "
                                        "--num-workers"})
    hsdp_replicas: int | None = field(default=None, metadata={"help": "HSDP: replicate the model "
                                      "across this many groups of workers and shard it within each "
                                      "group, so only the gradient all-reduce crosses groups; 1 is "
                                      "plain FSDP over all workers; default: one group per node "
                                      "when the run spans nodes, 1 on one node"})
    reduce_dtype: Literal["fp32", "bf16"] = field(default="fp32", metadata={"help": "dtype of "
                                                  "the gradient reduce-scatter/all-reduce on GPU "
                                                  "(master weights and optimizer stay fp32); bf16 "
                                                  "halves the gradient traffic"})
    accum_dtype: str | None = field(default=None, metadata={"help": "dtype the unsharded "
                                    "gradients accumulate in across the micro-batches of a step "
                                    "on GPU (`fp32` or `bf16`); default: --reduce-dtype, as FSDP2 "
                                    "does; `fp32` with --reduce-dtype bf16 still reduces once per "
                                    "step in bf16, at 2 more bytes per parameter of memory"})
    prefetch_layers: int = field(default=0, metadata={"help": "decoder layers whose all-gathers "
                                 "FSDP2 issues explicitly ahead, in forward and backward; 0 leaves "
                                 "FSDP2's implicit one-layer prefetch; 1 overlaps the same but is "
                                 "issued earlier from the CPU; more keeps a slow link busier at one "
                                 "gathered layer of memory each"})
    expect_transport: Literal["any", "efa"] = field(default="any", metadata={"help": "`efa`: "
                                                    "fail unless NCCL uses EFA between nodes"})
    on_fallback: Literal["fail", "warn"] = field(default="fail", metadata={"help": "when NCCL "
                                                 "fell back to TCP sockets: stop the job or only warn"})
    export: bool = field(default=False, metadata={"help": "at the end of a run that did not "
                         "fail, write a Hugging Face model directory (weights, config, generation "
                         "config, tokenizer) to <run directory>/hf_model, marked COMPLETE last"})
    export_dtype: Literal["bf16", "fp32"] = field(default="bf16", metadata={"help": "dtype of "
                                                  "the exported weights"})
    mlflow_tracking_uri: str | None = field(default=None, metadata={"help": "MLflow tracking "
                                            "server (http[s]://...): one MLflow run per training "
                                            "run, logged by rank 0; default: MLFLOW_TRACKING_URI, "
                                            "else no tracking"})
    lora_rank: int = field(default=0, metadata={"help": "LoRA: train rank-R adapters (PEFT) on "
                           "the --lora-target-modules of a frozen bf16 base instead of every "
                           "weight; checkpoints hold only the adapters, the export writes an "
                           "adapter directory and the merged model; 0: full fine-tuning"})
    lora_alpha: float = field(default=16.0, metadata={"help": "LoRA scaling numerator: the "
                              "adapters' update is scaled by alpha / rank"})
    lora_dropout: float = field(default=0.0, metadata={"help": "dropout on the adapters' input "
                                "(each adapted layer keeps its own dropped copy and mask of its "
                                "input for backward: more activation memory)"})
    lora_target_modules: str = field(default=LORA_TARGETS, metadata={"help": "comma-separated "
                                     "names of the decoder layers' linear layers that get "
                                     "adapters (the default: every attention and MLP "
                                     "projection)"})
    load_in_4bit: bool = field(default=False, metadata={"help": "QLoRA (a 4-bit base): refused "
                               "with the reason; see the README's LoRA section"})
    fault_at_step: int | None = field(default=None, metadata={"help": "test hook: one worker "
                                      "exits at this step of a fresh run", "hidden": True})
    fault_in_save_at_step: int | None = field(default=None, metadata={"help": "test hook: one "
                                              "worker exits while this step's asynchronous "
                                              "checkpoint is in flight", "hidden": True})
    nan_at_step: int | None = field(default=None, metadata={"help": "test hook: a weight turns "
                                    "NaN at this step of a fresh run", "hidden": True})
    hold_at_step: int | None = field(default=None, metadata={"help": "test hook: once per run, "
                                     "training waits at this step for a preemption, saves, and "
                                     "waits for Ray Train to stop it", "hidden": True})
    stall_upload_at_step: int | None = field(default=None, metadata={"help": "test hook: once "
                                             "per run, rank 0's asynchronous upload of this "
                                             "step's checkpoint never ends", "hidden": True})

    @property
    def tokens_per_step_per_worker(self) -> int:
        return self.micro_batch_size * self.grad_accum * self.seq_len

    def sequences_per_worker(self, world: int) -> int:
        """Sequences each of `world` workers trains on per optimizer step: --tokens-per-step's
        share (the planner only splits it into micro-batches), else micro-batch x accumulation.
        The one count the batch planner and the driver's epoch arithmetic both read."""
        if self.tokens_per_step is None:
            return self.micro_batch_size * self.grad_accum
        return max(1, self.tokens_per_step // (self.seq_len * world))

    def problems(self) -> list[str]:
        """Every problem with these settings, each naming its flag and the fix."""
        out = []
        positive = ("steps", "seq_len", "micro_batch_size", "grad_accum", "num_workers",
                    "log_every")
        for name in positive:
            if getattr(self, name) < 1:
                out.append(f"--{flag_name(name)} must be at least 1 (got {getattr(self, name)})")
        for name in ("checkpoint_every", "max_failures", "warmup_steps", "loss_chunk_tokens",
                     "prefetch_layers"):
            if getattr(self, name) < 0:
                out.append(f"--{flag_name(name)} must be 0 or more (got {getattr(self, name)})")
        if self.max_preemptions < -1:
            out.append(f"--max-preemptions must be -1 (any number) or more (got "
                       f"{self.max_preemptions})")
        if not self.lr > 0:
            out.append(f"--lr must be positive (got {self.lr})")
        if self.memory_budget_gib is not None and self.memory_budget_gib <= 0:
            out.append(f"--memory-budget-gib must be positive (got {self.memory_budget_gib})")
        if self.grad_clip < 0:
            out.append(f"--grad-clip must be 0 (off) or positive (got {self.grad_clip})")
        out += self._batch_problems()
        if self.reduce_dtype not in REDUCE_DTYPES:
            out.append(f"--reduce-dtype must be one of {REDUCE_DTYPES} (got {self.reduce_dtype!r})")
        if self.accum_dtype not in (None, *REDUCE_DTYPES):
            out.append(f"--accum-dtype must be one of {REDUCE_DTYPES} (got {self.accum_dtype!r})")
        elif self.accum_dtype == "bf16" and self.reduce_dtype == "fp32":
            out.append("--accum-dtype bf16 needs --reduce-dtype bf16 (FSDP2 accumulates in at "
                       "least the reduce dtype); drop --accum-dtype or set --reduce-dtype bf16")
        if self.expect_transport not in TRANSPORT_EXPECTATIONS:
            out.append(f"--expect-transport must be one of {TRANSPORT_EXPECTATIONS}")
        if self.export_dtype not in EXPORT_DTYPES:
            out.append(f"--export-dtype must be one of {EXPORT_DTYPES} (got {self.export_dtype!r})")
        if self.mlflow_tracking_uri is not None and \
                not re.match(r"^https?://[^/\s]+", self.mlflow_tracking_uri):
            out.append(f"--mlflow-tracking-uri must be a tracking server's http:// or https:// "
                       f"URL (got {self.mlflow_tracking_uri!r})")
        if self.on_fallback not in FALLBACK_ACTIONS:
            out.append(f"--on-fallback must be one of {FALLBACK_ACTIONS}")
        out += self._eval_problems()
        out += self._lora_problems()
        if not self.name or "/" in self.name:
            out.append(f"--name must be a non-empty name without '/' (got {self.name!r})")
        return out

    def _lora_problems(self) -> list[str]:
        out = []
        if self.load_in_4bit:
            out.append(f"--load-in-4bit: {QLORA_REFUSED}")
        if self.lora_rank < 0:
            out.append(f"--lora-rank must be 0 (full fine-tuning) or more (got {self.lora_rank})")
        if not self.lora_alpha > 0:
            out.append(f"--lora-alpha must be positive (got {self.lora_alpha})")
        if not 0 <= self.lora_dropout < 1:
            out.append(f"--lora-dropout must be at least 0 and below 1 (got {self.lora_dropout})")
        names = [t.strip() for t in self.lora_target_modules.split(",")]
        if not all(re.fullmatch(r"[A-Za-z_][\w.]*", n) for n in names):
            out.append("--lora-target-modules must be comma-separated module names, e.g. "
                       f"{LORA_TARGETS} (got {self.lora_target_modules!r})")
        return out

    def _eval_problems(self) -> list[str]:
        out = []
        if self.attention not in ATTENTION:
            out.append(f"--attention must be one of {ATTENTION} (got {self.attention!r})")
        if self.loss_tokens not in LOSS_TOKENS:
            out.append(f"--loss-tokens must be one of {LOSS_TOKENS} (got {self.loss_tokens!r})")
        if not 0 <= self.eval_fraction < 1:
            out.append(f"--eval-fraction must be at least 0 and below 1 (got {self.eval_fraction})")
        if self.eval_every < 0:
            out.append(f"--eval-every must be 0 or more (got {self.eval_every})")
        text = self.data not in RANDOM_DATA
        if self.epochs is not None and not (self.epochs > 0 and text):
            out.append(f"--epochs must be positive and needs --data files (got {self.epochs} on "
                       f"--data {self.data}); random tokens have no epochs: use --steps")
        if self.eval_fraction and self.eval_data:
            out.append("--eval-fraction and --eval-data both set: evaluate on one of them")
        if (self.eval_fraction or self.eval_data) and not text:
            out.append(f"--eval-fraction/--eval-data need --data files (got --data {self.data})")
        return out

    def _batch_problems(self) -> list[str]:
        out = []
        if self.hsdp_replicas is not None and (self.hsdp_replicas < 1 or self.num_workers >= 1
                                               and self.num_workers % self.hsdp_replicas):
            out.append(f"--hsdp-replicas must be at least 1 and divide --num-workers "
                       f"{self.num_workers} (got {self.hsdp_replicas})")
        if self.tokens_per_step is not None:
            unit = self.seq_len * self.num_workers
            if unit >= 1 and (self.tokens_per_step < unit or self.tokens_per_step % unit):
                out.append(f"--tokens-per-step must be a positive multiple of --seq-len x "
                           f"--num-workers = {unit} (got {self.tokens_per_step}; e.g. "
                           f"{unit * max(1, round(self.tokens_per_step / unit))})")
        return out

    def validated(self) -> "TrainConfig":
        problems = self.problems()
        if problems:
            raise ConfigError(problems)
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def exclusive(given: Collection[str]) -> list[str]:
    """Problems of fields given together that exclude each other (field names)."""
    if "steps" in given and "epochs" in given:
        return ["--steps and --epochs both set: --epochs derives the steps; give one of them"]
    return []


def flag_name(name: str) -> str:
    """A field's flag without the dashes: `max_failures` -> `max-failures`."""
    return name.replace("_", "-")


# The job reads the run's start time (written by the Ray head when the run's cluster starts,
# workloads/raycluster.py) from the file this variable names; it counts its time to first step
# from there, so node boot and image pull are included.
RUN_STARTED_ENV = "RUN_STARTED_AT_FILE"

# On a preemption the job moves the drain's deadline this much earlier (training/run/preemption.py:
# Ray Train's watcher polls every 5 s, its controller every 2 s), so Ray Train restarts the workers
# before their node's processes are killed; the GPU pods' drain (workloads/raycluster.py) leaves
# the emergency checkpoint what remains.
RESTART_MARGIN_S = 10.0


LOCAL_DEFAULTS = {"model": "tiny", "num_workers": 2, "use_gpu": False, "address": None}
"""What `--local` means: a local Ray with two CPU workers training the `tiny` shape."""
