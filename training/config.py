"""The training job's one typed configuration, parsed from the CLI and validated once.

Each field's annotation is its contract: its type, its choices (a `Literal`) and its range (a
`Bounds` in `Annotated`) are what the flags, a stack's settings and the validation read, so no
list of allowed values is written twice. Field docstrings are the CLI help (see
`training.flags`), so the flags, their defaults and their documentation cannot drift apart.
Validation collects every problem before reporting, each naming the flag to change.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Collection, Literal

from training.run_names import default_name
from training.errors import ConfigError
from training.field_types import Bounds, choices, expected, fits, is_typed

RANDOM_DATA = ("random", "repeat")  # --data values that are not files (training.data.random_tokens)
# LoRA's default targets: the attention and MLP projections of Qwen2 (and Llama-style) layers.
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
# Why --load-in-4bit is refused (docs/lora.md).
QLORA_REFUSED = ("QLoRA (a 4-bit base) is not supported: FSDP2 with bitsandbytes 4-bit weights "
                 "has lost the quantization silently or trained to loss 0 / NaN gradient norms "
                 "(axolotl#2992, accelerate#3983), bitsandbytes is in neither the job's image "
                 "nor the benchmark machine's, and it was never measured working here; use "
                 "--lora-rank R on the bf16 base (sharded: a 7B base is 3.8 GB per GPU over "
                 "a node's 4)")


def documented(default: Any, help: str) -> Any:
    """A field with its default and its --help text."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, kw_only=True)
class TestHooks:
    """Faults the job's own tests inject (training/run/hooks.py); no settings of a run.

    Flags like the settings' (tests/training/driver/test_job.py, tests/training/run/
    test_preemption.py pass them), but grouped here and not in TrainConfig's own fields: listed
    apart in --help, never tracked, and read only by training/run/hooks.py."""
    __test__ = False  # not a pytest class
    fault_at_step: int | None = documented(None, "one worker exits at this step of a fresh run")
    fault_in_save_at_step: int | None = documented(
        None, "one worker exits while this step's asynchronous checkpoint is in flight")
    nan_at_step: int | None = documented(None, "a weight turns NaN at this step of a fresh run")
    hold_at_step: int | None = documented(
        None, "once per run, training waits at this step for a preemption, saves, and waits for "
        "Ray Train to stop it; 0: the workers wait as their model's load begins (nothing saved)")
    stall_upload_at_step: int | None = documented(
        None, "once per run, rank 0's asynchronous upload of this step's checkpoint never ends")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    model: str = documented(
        "tiny", "built-in random-init shape (`tiny`, `qwen2.5-1.5b`, `qwen2.5-7b`), a Hugging "
        "Face model id, or a model directory (local or s3://bucket/prefix/, e.g. a previous "
        "run's export)")
    tokenizer: str | None = documented(
        None, "tokenizer id or directory for --data text files, or `bytes` (UTF-8 bytes, built "
        "in); defaults to --model")
    steps: Annotated[int, Bounds(ge=1)] = documented(
        30, "optimizer steps to train (in total, across resumes)")
    epochs: Annotated[float | None, Bounds(gt=0)] = documented(
        None, "train this many passes over --data instead of --steps: the steps follow from the "
        "tokenized data and the batch (rounded up) and are logged; every epoch reads the "
        "documents in a new order seeded by --seed")
    seq_len: Annotated[int, Bounds(ge=1)] = documented(128, "tokens per sequence")
    micro_batch_size: Annotated[int, Bounds(ge=1)] = documented(
        4, "sequences per worker per forward pass")
    grad_accum: Annotated[int, Bounds(ge=1)] = documented(1, "micro-batches per optimizer step")
    lr: Annotated[float, Bounds(gt=0)] = documented(
        1e-3, "peak learning rate (warmup then cosine decay)")
    warmup_steps: Annotated[int, Bounds(ge=0)] = documented(5, "linear warmup steps")
    weight_decay: float = documented(0.1, "AdamW weight decay")
    grad_clip: Annotated[float, Bounds(ge=0, means="off")] = documented(
        1.0, "max gradient norm (0 disables)")
    num_workers: Annotated[int, Bounds(ge=1)] = documented(
        2, "Ray Train workers (one per GPU on GPU clusters)")
    use_gpu: bool | None = documented(
        None, "one GPU per worker; default: only when the Ray cluster has GPUs")
    data: str = documented(
        "random", "a path, an s3:// URI or a Hugging Face Hub dataset "
        "(hf://org/name[/config][@revision][:split], default split train) of .jsonl or .parquet "
        "files with a `text`, `prompt` + `completion`, or `messages` column (the format is told "
        "from the columns); or `random` (fresh deterministic random tokens each step) or "
        "`repeat` (one random batch over and over), for transport and throughput checks only")
    loss_tokens: Literal["completion", "all"] = documented(
        "completion", "`completion`: train on completions and assistant turns only (all of "
        "`text` data); `all`: on every token")
    objective: Literal["sft", "dpo"] = documented(
        "sft", "`sft`: supervised next-token loss; `dpo`: Direct Preference Optimization on "
        "TRL's preference data (`prompt` + `chosen` + `rejected`, or `chosen` + `rejected` "
        "conversations), the sigmoid loss against the initial model (docs/dpo.md)")
    dpo_beta: Annotated[float, Bounds(gt=0)] = documented(
        0.1, "DPO's beta: how far the policy may move from the reference (TRL's default 0.1)")
    eval_data: str | None = documented(
        None, "held-out data to evaluate on (same formats as --data)")
    eval_fraction: Annotated[float, Bounds(ge=0, lt=1)] = documented(
        0.0, "hold out this fraction of --data's documents (a fixed choice, never trained on) to "
        "evaluate on; 0: none")
    eval_every: Annotated[int, Bounds(ge=0)] = documented(
        0, "evaluate every N steps (also before the first step and after the last); 0: only then")
    storage_path: str = documented(
        "./outputs", "where checkpoints and metrics go (local directory or s3://bucket/prefix; "
        "shared storage on clusters)")
    name: str | None = documented(None, "run name; the same name and storage path resume the "
                                  "run; default: `<model>-<key>` of what defines it (run_names.py)")
    checkpoint_every: Annotated[int, Bounds(ge=0)] = documented(
        10, "save a checkpoint every N steps and at the end; 0 disables checkpoints")
    async_checkpoint: bool = documented(
        True, "save checkpoints with DCP's asynchronous save: training continues while they are "
        "written and uploaded (one in flight; host memory for one copy of this worker's shards)")
    max_failures: Annotated[int, Bounds(ge=0)] = documented(
        0, "worker failures to recover from by restarting from the latest checkpoint")
    max_preemptions: Annotated[int, Bounds(ge=-1, means="any number")] = documented(
        -1, "node preemptions (a spot reclaim, a drained node, an evicted pod) to recover from, "
        "apart from --max-failures: each saves a checkpoint at the step it interrupts and "
        "resumes from it; -1: any number")
    address: str | None = documented(
        None, "Ray address (`auto` on the cluster); default starts a local Ray")
    log_every: Annotated[int, Bounds(ge=1)] = documented(5, "progress line every N steps")
    seed: int = documented(0, "seed for init and random data")
    activation_checkpointing: bool | None = documented(
        None, "recompute decoder layers in backward to save memory; default: on only when the "
        "memory estimate exceeds the GPU (or --memory-budget-gib)")
    memory_budget_gib: Annotated[float | None, Bounds(gt=0)] = documented(
        None, "cap per-GPU memory (e.g. 22 to rehearse 24 GB L4s on a larger GPU)")
    reshard_after_forward: bool | None = documented(
        None, "FSDP2: free gathered layer weights after forward (ZeRO-3); off keeps them "
        "(ZeRO-2: more memory, less communication); default: off when they fit without "
        "activation checkpointing, on otherwise")
    attention: Literal["sdpa", "flex_attention"] = documented(
        "sdpa", "attention kernel (transformers' attn_implementation); both keep packed "
        "documents apart: sdpa with a dense block mask, flex_attention with a block-sparse one")
    loss_chunk_tokens: Annotated[int, Bounds(ge=0)] = documented(
        2048, "tokens per chunk of the fused LM-head + cross-entropy (never materializes the "
        "full logits); 0 computes full logits (for comparison only)")
    compile: bool | None = documented(
        None, "torch.compile each decoder layer and the fused loss's chunk step; default: on "
        "with GPUs, off on CPU")
    tokens_per_step: int | None = documented(
        None, "tokens per optimizer step across all workers (the global batch); the job then "
        "picks --micro-batch-size and --grad-accum to fit GPU memory and reports both; must be a "
        "multiple of --seq-len x --num-workers")
    hsdp_replicas: int | None = documented(
        None, "HSDP: replicate the model across this many groups of workers and shard it within "
        "each group, so only the gradient all-reduce crosses groups; 1 is plain FSDP over all "
        "workers; default: one group per node when the run spans nodes, 1 on one node")
    reduce_dtype: Literal["fp32", "bf16"] = documented(
        "fp32", "dtype of the gradient reduce-scatter/all-reduce on GPU (master weights and "
        "optimizer stay fp32); bf16 halves the gradient traffic")
    accum_dtype: Literal["fp32", "bf16"] | None = documented(
        None, "dtype the unsharded gradients accumulate in across the micro-batches of a step on "
        "GPU (`fp32` or `bf16`); default: --reduce-dtype, as FSDP2 does; `fp32` with "
        "--reduce-dtype bf16 still reduces once per step in bf16, at 2 more bytes per parameter "
        "of memory")
    prefetch_layers: Annotated[int, Bounds(ge=0)] = documented(
        0, "decoder layers whose all-gathers FSDP2 issues explicitly ahead, in forward and "
        "backward; 0 leaves FSDP2's implicit one-layer prefetch; 1 overlaps the same but is "
        "issued earlier from the CPU; more keeps a slow link busier at one gathered layer of "
        "memory each")
    expect_transport: Literal["any", "efa"] = documented(
        "any", "`efa`: fail unless NCCL uses EFA between nodes")
    on_fallback: Literal["fail", "warn"] = documented(
        "fail", "when NCCL fell back to TCP sockets: stop the job or only warn")
    efa_floor_gbps: Annotated[float | None, Bounds(gt=0)] = documented(
        None, "the lowest bus bandwidth (GB/s) a healthy link between the run's nodes gives the "
        "warm-up probe (the stack sets its instance type's, stack/catalog.py); below it the job "
        "warns with the slowdown the step-time model predicts, or with --strict-efa stops before "
        "the first step; default: no check")
    strict_efa: bool = documented(
        False, "a link below --efa-floor-gbps stops the job before its first step instead of a "
        "warning (the stack's strictEfa)")
    export: bool = documented(
        False, "at the end of a run that did not fail, write a Hugging Face model directory "
        "(weights, config, generation config, tokenizer) to <run directory>/hf_model, marked "
        "COMPLETE last")
    export_dtype: Literal["bf16", "fp32"] = documented("bf16", "dtype of the exported weights")
    mlflow_tracking_uri: str | None = documented(
        None, "MLflow tracking server (http[s]://...): one MLflow run per training run, logged "
        "by rank 0; default: MLFLOW_TRACKING_URI, else no tracking")
    lora_rank: Annotated[int, Bounds(ge=0, means="full fine-tuning")] = documented(
        0, "LoRA: train rank-R adapters (PEFT) on the --lora-target-modules of a frozen bf16 "
        "base instead of every weight; checkpoints hold only the adapters, the export writes an "
        "adapter directory and the merged model; 0: full fine-tuning")
    lora_alpha: Annotated[float, Bounds(gt=0)] = documented(
        16.0, "LoRA scaling numerator: the adapters' update is scaled by alpha / rank")
    lora_dropout: Annotated[float, Bounds(ge=0, lt=1)] = documented(
        0.0, "dropout on the adapters' input (each adapted layer keeps a dropped copy: memory)")
    lora_target_modules: str = documented(
        LORA_TARGETS, "comma-separated names of the decoder layers' linear layers that get "
        "adapters (the default: every attention and MLP projection)")
    load_in_4bit: bool = documented(
        False, "QLoRA (a 4-bit base): refused with the reason; see docs/lora.md")
    allow_untested_architecture: bool = documented(
        False, "train a --model outside the supported families (docs/models.md: multimodal, "
        "mixture-of-experts, an unknown architecture, Qwen3.5's packed linear attention) "
        "instead of refusing it; the run's log states what is untested")
    harness_tasks: str | None = documented(
        None, "after the export, score the base and the tuned model with lm-evaluation-harness "
        "on these comma-separated lm-eval task names, task YAML files or folders; needs --export")
    harness_limit: Annotated[int | None, Bounds(ge=1)] = documented(
        None, "examples per --harness-tasks task (lm-eval's --limit); default: every example")
    harness_fewshot: Annotated[int | None, Bounds(ge=0)] = documented(
        None, "few-shot examples per prompt (lm-eval's --num_fewshot); default: each task's own")
    sample_prompts: Annotated[int, Bounds(ge=0)] = documented(
        0, "after the export, greedy answers of the base and the fine-tuned model to this many "
        "prompts of the evaluation set, side by side in <run directory>/samples.jsonl and the "
        "log; needs --export and --eval-fraction or --eval-data")
    test_hooks: TestHooks = field(default_factory=TestHooks)  # no setting: its own flag group

    def __post_init__(self):  # no --name: named from what defines the run
        if self.name is None:
            object.__setattr__(self, "name", default_name(self))

    @property
    def sample_tokens(self) -> int:
        """Input tokens of one sample row: --seq-len, or for --objective dpo two sequences of
        it (TRL's max_length each, training/data/preference.py), the planner's unit."""
        return self.seq_len * (2 if self.objective == "dpo" else 1)

    @property
    def tokens_per_step_per_worker(self) -> int:
        return self.micro_batch_size * self.grad_accum * self.sample_tokens

    def sequences_per_worker(self, world: int) -> int:
        """Sequences each of `world` workers trains on per optimizer step: --tokens-per-step's
        share (the planner only splits it into micro-batches), else micro-batch x accumulation.
        The one count the batch planner and the driver's epoch arithmetic both read."""
        if self.tokens_per_step is None:
            return self.micro_batch_size * self.grad_accum
        return max(1, self.tokens_per_step // (self.sample_tokens * world))

    def problems(self) -> list[str]:
        """Every problem with these settings, each naming its flag and the fix: every option
        against its annotation (type, choices, range), then the checks across options, which
        compare values and so run once every option has its type (a choice aside)."""
        out, mistyped = [], False
        from training.options import options  # it reads TrainConfig's fields: imported here

        for option in options():
            value = option.value(self)
            if not fits(option.hint, value):
                typed = is_typed(option.hint, value)  # then a choice outside the Literal's
                mistyped |= not typed
                what = (f"one of {', '.join(map(repr, choices(option.hint)))}" if typed
                        else expected(option.hint))
                out.append(f"{option.flag} must be {what} (got {value!r})")
            elif option.bounds and not option.bounds.holds(value):
                out.append(f"{option.flag} must be {option.bounds} (got {value})")
        if mistyped:
            return out
        if self.accum_dtype == "bf16" and self.reduce_dtype == "fp32":
            out.append("--accum-dtype bf16 needs --reduce-dtype bf16 (FSDP2 accumulates in at "
                       "least the reduce dtype); drop --accum-dtype or set --reduce-dtype bf16")
        if self.mlflow_tracking_uri is not None and \
                not re.match(r"^https?://[^/\s]+", self.mlflow_tracking_uri):
            out.append(f"--mlflow-tracking-uri must be a tracking server's http:// or https:// "
                       f"URL (got {self.mlflow_tracking_uri!r})")
        if self.load_in_4bit:
            out.append(f"--load-in-4bit: {QLORA_REFUSED}")
        names = [t.strip() for t in self.lora_target_modules.split(",")]
        if not all(re.fullmatch(r"[A-Za-z_][\w.]*", n) for n in names):
            out.append("--lora-target-modules must be comma-separated module names, e.g. "
                       f"{LORA_TARGETS} (got {self.lora_target_modules!r})")
        if not self.name or "/" in self.name:
            out.append(f"--name must be a non-empty name without '/' (got {self.name!r})")
        return out + self._batch_problems() + self._data_problems() + self._after_export_problems()

    def _data_problems(self) -> list[str]:
        out = []
        text = self.data not in RANDOM_DATA
        if self.epochs is not None and not text:
            out.append(f"--epochs needs --data files (got --data {self.data}); random tokens "
                       f"have no epochs: use --steps")
        if self.eval_fraction and self.eval_data:
            out.append("--eval-fraction and --eval-data both set: evaluate on one of them")
        if self.objective == "dpo" and not text:
            out.append(f"--objective dpo needs preference --data files (got --data {self.data}"
                       f"); e.g. hf://trl-lib/ultrafeedback_binarized")
        if (self.eval_fraction or self.eval_data) and not text:
            out.append(f"--eval-fraction/--eval-data need --data files (got --data {self.data})")
        return out

    def _after_export_problems(self) -> list[str]:
        """The harness and the sample answers compare the export with its base."""
        out, asked = [], [f for f, on in (("--harness-tasks", self.harness_tasks),
                                          ("--sample-prompts", self.sample_prompts)) if on]
        if asked and not self.export:
            out.append(f"{' and '.join(asked)} score the exported model: add --export")
        if asked and self.data in RANDOM_DATA:
            out.append(f"{' and '.join(asked)} need --data files and a tokenizer "
                       f"(got --data {self.data})")
        if self.sample_prompts and not (self.eval_fraction or self.eval_data):
            out.append("--sample-prompts takes its prompts from the evaluation set: add "
                       "--eval-fraction or --eval-data")
        if self.harness_tasks is not None and not [
                t for t in self.harness_tasks.split(",") if t.strip()]:
            out.append("--harness-tasks must name at least one task (got an empty list)")
        return out

    def _batch_problems(self) -> list[str]:
        out = []
        if self.hsdp_replicas is not None and (self.hsdp_replicas < 1 or self.num_workers >= 1
                                               and self.num_workers % self.hsdp_replicas):
            out.append(f"--hsdp-replicas must be at least 1 and divide --num-workers "
                       f"{self.num_workers} (got {self.hsdp_replicas})")
        if self.tokens_per_step is not None:
            unit = self.sample_tokens * self.num_workers
            if unit >= 1 and (self.tokens_per_step < unit or self.tokens_per_step % unit):
                rows = "2 x --seq-len (a pair row)" if self.objective == "dpo" else "--seq-len"
                out.append(f"--tokens-per-step must be a positive multiple of {rows} x "
                           f"--num-workers = {unit} (got {self.tokens_per_step}; e.g. "
                           f"{unit * max(1, round(self.tokens_per_step / unit))})")
        return out

    def validated(self) -> "TrainConfig":
        problems = self.problems()
        if problems:
            raise ConfigError(problems)
        return self

    def to_dict(self) -> dict:
        """The run's settings as plain values (what a run is tracked with): every field but
        the test hooks, which are no setting of a run."""
        settings = dataclasses.asdict(self)
        del settings["test_hooks"]
        return settings


def exclusive(given: Collection[str]) -> list[str]:
    """Problems of fields given together that exclude each other (field names)."""
    if "steps" in given and "epochs" in given:
        return ["--steps and --epochs both set: --epochs derives the steps; give one of them"]
    return []


def flag_name(name: str) -> str:
    """A field's flag without the dashes: `max_failures` -> `max-failures`."""
    return name.replace("_", "-")
