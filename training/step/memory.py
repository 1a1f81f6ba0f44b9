"""Per-GPU memory estimate and the batch planner built on it.

The estimate (bytes, per GPU) is what must fit on the device, not only torch's tensors:
  - sharded fp32 state: weights, gradients, two Adam moments, 16 bytes per parameter over the
    shard group;
  - gradient accumulation without communication keeps unsharded gradients of the whole model in
    the accumulation dtype until the last micro-batch (FSDP2
    `FSDPParam.to_accumulated_grad_if_needed` upcasts them to the policy's reduce dtype: 4
    bytes/param for fp32, 2 for bf16);
  - ZeRO-2 keeps the whole gathered bf16 model (2 bytes/param) between forward and backward;
  - LoRA (`Footprint.trainable_params`): that state for the adapters only, 2 bytes a parameter
    for the frozen bf16 base, no head gradient in the loss, and ZeRO-3's gathered root group and
    two layers counted (`gathered_bytes`);
  - the fused loss's buffers (`training/model/loss.py`): one chunk's fp32 logits and their bf16
    gradient, the fp32 head-gradient accumulator and one chunk's term of it, the bf16 gradient
    of the hidden states it saves for backward;
  - saved activations of one micro-batch (smaller for compiled layers, which save fewer
    intermediates);
  - at the larger of two moments (`Parts.at_factor`): the loss's forward, its chunk's logits
    beside the activations saved by then (with checkpointing only the layers' inputs), or a
    checkpointed layer's recompute in backward, after those logits are freed;
  - what the caching allocator reserves beyond its tensors (`STATIC_FACTOR` on the tensors above);
  - outside torch's allocator: the CUDA context, cuBLAS workspaces (`FIXED_GIB`) and NCCL's
    buffers when there are peers (`NCCL_GIB`).
The measured peak it is calibrated against is `torch.cuda.max_memory_reserved` plus the device
memory outside torch's allocator (bench/calibrate.py): reserved memory is what runs out first.
It must fit in 90% of the GPU (or --memory-budget-gib).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from training.config import TrainConfig
from training.errors import ConfigError

HEADROOM = 0.9
MIN_LOSS_CHUNK = 512  # tokens: below this a chunk's GEMM is small enough to cost launches
REDUCE_BYTES = {"fp32": 4, "bf16": 2}
GIB = 2**30

# Calibration constants. STATIC_FACTOR (the allocator's usual reserve on the tensors it holds),
# FIXED_GIB (the device memory outside torch's allocator on one GPU: CUDA 13's context, cuBLAS
# workspaces and the compiled kernels; 1.28 .. 1.31 GiB in every H200 row recorded since
# 2026-12-01, `outside_torch_gib`) and NCCL_GIB (NCCL's default buffers for a handful of
# channels and peers) are set from what they are, not fitted: on one GPU every row holds nearly
# the same static bytes, so a free fit trades them against each other (it put 11 GiB "outside"
# the allocator and under-counted the state, which would refuse plans on an L4). FIXED_GIB was
# 0.75, under the measured 1.3, until the estimate counted the loss's chunk logits and a
# checkpointed layer's recompute at separate moments (`Parts.at_factor`): counted together they
# had made up the difference on 7B-8B shapes and over-counted Gemma 3's (+5.7%). The activation
# factors, by (compiled, activation checkpointing), are fit by `python -m bench.calibrate --fit`
# to every recorded H200 row (bench/runs/: the full fine-tuning grid of 2026-12-01,
# i22-calibration.json, -3.8% .. +2.9% with these values, one row each with checkpointing);
# tests/training/step/test_calibration.py holds every recorded row to the tolerance.
STATIC_FACTOR = 1.05
ACTIVATION_FACTOR = {(False, False): 0.868, (True, False): 0.574,  # (compiled, checkpointing)
                     (False, True): 3.822, (True, True): 1.872}
# LoRA's (compiled, checkpointing) factors, its own: a frozen base saves what full fine-tuning
# saves, but the peak's moment differs (no weight gradients, no head gradient). Fit by `python
# -m bench.calibrate --fit` to the H200 LoRA rows (the grid of 2026-12-02,
# i40-lora-calibration.json: 7B at 512..2048 and 1.5B at 1024..2048 tokens, micro-batch 1..4;
# bench.lora's rows since, Llama-3.1-8B, Qwen3-8B, Ministral-8B and Gemma-3-12B among them),
# centred in the band the planner is held to (-10% .. +5%: bench.calibrate `centred`) rather
# than by least squares: -9.1% .. +4.1% on the 32 rows; eager LoRA keeps full fine-tuning's
# factors (unmeasured).
LORA_ACTIVATION_FACTOR = {**ACTIVATION_FACTOR, (True, False): 0.492, (True, True): 1.229}
FIXED_GIB = 1.3
NCCL_GIB = 0.5


@dataclass(frozen=True)
class Footprint:
    """What the estimate needs to know about the run besides the settings."""
    model_cfg: PretrainedConfig
    num_params: int
    shard_size: int
    limit_bytes: int | None  # None: CPU, no limit
    compiled: bool = False  # decoder layers compiled (fewer saved activations)
    world: int = 1  # ranks: NCCL's buffers only when there are peers
    # LoRA (training/model/lora.py): the adapters' parameter count; None is full fine-tuning.
    # The rest is a frozen bf16 base: 2 bytes a parameter, no gradient, no Adam state.
    trainable_params: int | None = None
    lora_dropout: bool = False  # each adapted layer keeps a dropped copy of its input and a mask
    # LoRA: the frozen base whole on every GPU, outside FSDP2 (parallelize.shard_model): 2 bytes a
    # frozen parameter unsharded, nothing gathered but the adapters
    replicated_base: bool = False

    @property
    def trainable(self) -> int:
        return self.num_params if self.trainable_params is None else self.trainable_params


# Bytes of saved activations per token per decoder layer, without checkpointing, in bf16:
# ~24 hidden-sized and ~4 intermediate-sized tensors. Calibrated against the 33 GiB of activations
# measured for Qwen2.5-1.5B at 8,192 tokens per GPU (design notes' FSDP2 table).
def _activation_bytes_per_token_layer(model_cfg: PretrainedConfig) -> int:
    return 2 * (24 * model_cfg.hidden_size + 4 * model_cfg.intermediate_size)


def _dropout_bytes_per_token_layer(model_cfg: PretrainedConfig) -> int:
    """LoRA dropout: the inputs of the default targets (q, k, v, o, gate, up: hidden-sized; down:
    intermediate-sized) each saved again, dropped (bf16), with their bool mask."""
    return 3 * (6 * model_cfg.hidden_size + model_cfg.intermediate_size)


def activation_bytes(model_cfg: PretrainedConfig, tokens: int, checkpointing: bool,
                     lora_dropout: bool = False) -> int:
    """Saved activations of one micro-batch (eager); checkpointing keeps each layer's bf16 input
    plus one layer's activations while it is recomputed. A frozen base saves what full
    fine-tuning saves: the adapters' A save the inputs the base's weight gradients would."""
    per_layer = _activation_bytes_per_token_layer(model_cfg)
    if lora_dropout:
        per_layer += _dropout_bytes_per_token_layer(model_cfg)
    if checkpointing:
        return checkpoint_bytes(model_cfg, tokens) + tokens * per_layer
    return tokens * model_cfg.num_hidden_layers * per_layer


def checkpoint_bytes(model_cfg: PretrainedConfig, tokens: int) -> int:
    """What activation checkpointing keeps of a micro-batch through the whole step: each
    decoder layer's bf16 input."""
    return tokens * model_cfg.num_hidden_layers * 2 * model_cfg.hidden_size


def chunk_bytes(model_cfg: PretrainedConfig, tokens: int, chunk_tokens: int) -> int:
    """The fused loss's buffers that live only inside its forward (training/model/loss.py), one
    chunk at a time: the chunk's fp32 logits (exponentiated in place) and their bf16 gradient;
    none unfused (`chunk_tokens` 0: the logits are the model's output, kept for backward)."""
    return min(chunk_tokens, tokens) * model_cfg.vocab_size * (4 + 2) if chunk_tokens else 0


def loss_bytes(model_cfg: PretrainedConfig, tokens: int, chunk_tokens: int,
               head_trainable: bool = True) -> int:
    """The LM head + cross-entropy's buffers at their peak (training/model/loss.py): fused, one
    chunk's (`chunk_bytes`), the fp32 head-gradient accumulator and the chunk's fp32 term (none
    for a frozen head), and the bf16 hidden-state gradient kept for backward; unfused
    (`chunk_tokens` 0), the whole micro-batch's bf16 logits, their fp32 upcast and gradient."""
    vocab, hidden = model_cfg.vocab_size, model_cfg.hidden_size
    if not chunk_tokens:
        return tokens * vocab * (2 + 4 + 4)
    head_grad = 2 * 4 * vocab * hidden if head_trainable else 0
    return chunk_bytes(model_cfg, tokens, chunk_tokens) + head_grad + 2 * tokens * hidden


def gathered_bytes(fp: Footprint, zero2: bool) -> int:
    """FSDP2's unsharded bf16 weights: all of them under ZeRO-2; under ZeRO-3 with a frozen base
    (LoRA), the root group (embeddings and LM head, gathered for the whole step) and two decoder
    layers (the one computing and the one prefetched). Full fine-tuning's ZeRO-3 rows leave them
    to STATIC_FACTOR, whose 5% on 16 bytes a parameter covers them in every recorded row
    (counting them there too gives -2.7% .. +3.4% instead of -4.0% .. +3.4%, but moves plans
    near a limit, so not without new measurements); a 2-byte frozen base leaves no such margin."""
    if fp.replicated_base:
        return 2 * fp.trainable if zero2 else 0
    if zero2:
        return 2 * fp.num_params
    if fp.trainable_params is None:
        return 0
    cfg = fp.model_cfg
    embeddings = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    per_layer = (fp.num_params - embeddings) / cfg.num_hidden_layers
    return int(2 * (embeddings + 2 * per_layer))


@dataclass(frozen=True)
class Parts:
    """The estimate's terms in bytes: `static` (every tensor held through the step but
    activations, before the allocator's reserve), raw eager `activations`, what lies outside
    torch's allocator, `resident` bytes held whole from build to the end (no reserve on them),
    and the fused loss's `transient` chunk buffers with the activations `held` beside them."""
    static: float
    activations: float
    outside: float
    compiled: bool
    checkpointing: bool
    resident: float = 0.0  # a replicated frozen base: allocated once, no allocator reserve
    lora: bool = False  # LoRA's activation factors
    transient: float = 0.0  # `chunk_bytes`: only inside the loss's forward
    held: float = 0.0  # with checkpointing, the layers' inputs (`checkpoint_bytes`)

    @property
    def factor(self) -> float:
        table = LORA_ACTIVATION_FACTOR if self.lora else ACTIVATION_FACTOR
        return table[self.compiled, self.checkpointing]

    @property
    def total(self) -> int:
        return self.at_factor(self.factor)

    def at_factor(self, factor: float) -> int:
        """The estimate with `factor` on the activations: the larger of two moments. In the
        loss's forward its chunk buffers sit beside the activations saved by then, all of them
        or, with checkpointing, only the layers' inputs; a checkpointed layer is recomputed in
        backward, after the loss has freed them (it keeps only the gradients it computed). At
        Gemma 3's 262,208-word vocabulary and 8,192 tokens a micro-batch both are about 3 GiB:
        counting them together put the estimate 5.7% over the H200's measured peak."""
        saved = factor * self.activations
        at_loss = STATIC_FACTOR * (self.transient + self.held) + (
            0 if self.checkpointing else saved)
        return int(self.resident + STATIC_FACTOR * self.static + max(at_loss, saved)
                   + self.outside)


def estimate_parts(fp: Footprint, *, micro_batch: int, seq_len: int, grad_accum: int,
                   reduce_dtype: str, checkpointing: bool, zero2: bool,
                   accum_dtype: str | None = None, loss_chunk_tokens: int = 2048) -> Parts:
    tokens = micro_batch * seq_len
    frozen = fp.num_params - fp.trainable
    # A replicated base is allocated once, whole, at build and never freed: no allocator reserve
    # on it (`Parts.resident`); sharded, it is counted with the rest of the state.
    resident = 2 * frozen if fp.replicated_base else 0
    state = (16 * fp.trainable + (0 if fp.replicated_base else 2 * frozen)) / fp.shard_size
    accumulated = (REDUCE_BYTES[accum_dtype or reduce_dtype] * fp.trainable
                   if grad_accum > 1 else 0)
    cfg = fp.model_cfg
    transient = chunk_bytes(cfg, tokens, loss_chunk_tokens)
    loss = loss_bytes(cfg, tokens, loss_chunk_tokens, head_trainable=fp.trainable_params is None)
    static = state + accumulated + gathered_bytes(fp, zero2) + loss - transient
    outside = (FIXED_GIB + (NCCL_GIB if fp.world > 1 else 0)) * GIB
    activations = activation_bytes(cfg, tokens, checkpointing, fp.lora_dropout)
    return Parts(static, activations, outside, fp.compiled, checkpointing, resident,
                 fp.trainable_params is not None, transient,
                 checkpoint_bytes(cfg, tokens) if checkpointing else 0)


def estimate_bytes(fp: Footprint, **shape) -> int:
    """Bytes per GPU at the step's peak for the shape (`estimate_parts`' keywords)."""
    return estimate_parts(fp, **shape).total


def _shape(cfg: TrainConfig, micro_batch: int, grad_accum: int, checkpointing: bool,
           zero2: bool, loss_chunk_tokens: int | None) -> dict:
    return {"micro_batch": micro_batch, "seq_len": cfg.sample_tokens, "grad_accum": grad_accum,
            "reduce_dtype": cfg.reduce_dtype, "accum_dtype": cfg.accum_dtype,
            "checkpointing": checkpointing, "zero2": zero2,
            "loss_chunk_tokens": cfg.loss_chunk_tokens if loss_chunk_tokens is None
            else loss_chunk_tokens}


def fits(fp: Footprint, cfg: TrainConfig, *, micro_batch: int, grad_accum: int,
         checkpointing: bool = False, zero2: bool = False,
         loss_chunk_tokens: int | None = None) -> bool:
    """True on CPU (no limit) or when the estimate is within 90% of the limit
    (`loss_chunk_tokens` None: --loss-chunk-tokens)."""
    if fp.limit_bytes is None:
        return True
    need = estimate_bytes(fp, **_shape(cfg, micro_batch, grad_accum, checkpointing, zero2,
                                       loss_chunk_tokens))
    return need <= HEADROOM * fp.limit_bytes


def loss_chunks(cfg: TrainConfig, fp: Footprint) -> tuple[int, ...]:
    """The fused loss's chunk sizes the planner may use, largest first: --loss-chunk-tokens,
    and for LoRA also its half and quarter down to MIN_LOSS_CHUNK. A LoRA step is launch-bound,
    so a larger micro-batch is worth more than a large chunk: at 7B, seq 2048 under an L4's
    22 GiB, micro-batch 2 ran 11,696 tokens/s with 1,024-token chunks and 11,770 with 2,048
    (whose estimate, 20.2 GiB, was over the 19.8 allowed) against micro-batch 1's 9,090; one
    chunk's fp32 logits and bf16 gradient are 1.7 GiB at 2,048 tokens of Qwen2.5's vocabulary
    (H200, 2026-12-02: bench/runs/2026-12-02/chunk-ab-*.json, i40-lora-l4-2048.json). Full
    fine-tuning keeps the flag's chunk: its plans are measured with it."""
    chunk = cfg.loss_chunk_tokens
    if fp.trainable_params is None or not chunk:
        return (chunk,)
    return (chunk, *(chunk >> i for i in (1, 2) if chunk >> i >= MIN_LOSS_CHUNK))


def cannot_fit(fp: Footprint, cfg: TrainConfig, *, micro_batch: int, grad_accum: int,
               headroom: float = HEADROOM) -> str | None:
    """Why this plan cannot fit even with activation checkpointing, ZeRO-3 and the smallest
    loss chunk (the frugal end of every lever), or None when it can (or there is no limit)."""
    if fp.limit_bytes is None:
        return None
    need = estimate_bytes(fp, **_shape(cfg, micro_batch, grad_accum, True, False,
                                       loss_chunks(cfg, fp)[-1]))
    if need <= headroom * fp.limit_bytes:
        return None
    fix = ("--seq-len, or add workers" if cfg.tokens_per_step else
           "--micro-batch-size (raise --grad-accum to keep the batch) or --seq-len, or add workers")
    return (f"micro-batch {micro_batch} at --seq-len {cfg.seq_len} needs about "
            f"{need / headroom / 2**30:.1f} GiB per GPU even with activation checkpointing, over "
            f"the {fp.limit_bytes / 2**30:.1f} GiB available; lower {fix}")


@dataclass(frozen=True)
class BatchPlan:
    """Micro-batch size and accumulation steps per optimizer step: decided once (`plan_batch`) and
    read by the driver's check, the engine, the loop and the evaluation."""
    micro_batch_size: int
    grad_accum: int
    # The fused loss's chunk when the planner chose one below --loss-chunk-tokens so that a
    # larger LoRA micro-batch fits (`loss_chunks`); None: the flag's.
    loss_chunk_tokens: int | None = None

    def samples_per_step(self, world: int) -> int:
        """Samples every rank together consumes in one optimizer step."""
        return world * self.grad_accum * self.micro_batch_size

    def tokens_per_step(self, seq_len: int, world: int) -> int:
        return self.samples_per_step(world) * seq_len


def plan_batch(cfg: TrainConfig, fp: Footprint, world: int, *, headroom: float = HEADROOM,
               note: str = "") -> BatchPlan:
    """The batch plan for --tokens-per-step, or the flags' own when it is not set; refused with
    the fix (`cannot_fit`, `note` appended) when it cannot fit in `headroom` of the limit even at
    the frugal end of every lever.

    The largest micro-batch that divides the worker's sequences per step and fits without
    activation checkpointing wins (fewer, larger micro-batches: larger GEMMs, fewer launches; the
    communication happens once per step either way); if none does, the largest that fits with
    checkpointing; micro-batch 1 if nothing fits (then refused, or it fits only past 90%).
    """
    plan = _choose_batch(cfg, fp, world)
    if (why := cannot_fit(fp, cfg, micro_batch=plan.micro_batch_size,
                          grad_accum=plan.grad_accum, headroom=headroom)):
        raise ConfigError([why + note])
    return plan


def _choose_batch(cfg: TrainConfig, fp: Footprint, world: int) -> BatchPlan:
    if cfg.tokens_per_step is None:  # the flags' batch; only the loss chunk is the planner's
        sizes, sequences = [cfg.micro_batch_size], cfg.micro_batch_size * cfg.grad_accum
    else:
        sequences = cfg.sequences_per_worker(world)
        sizes = [m for m in range(sequences, 0, -1) if sequences % m == 0]
    explicit = cfg.activation_checkpointing
    levels = (False, True) if explicit is None else (explicit,)
    # (micro-batch, checkpointing) in order of preference. Full fine-tuning: no checkpointing
    # first. LoRA: the larger micro-batch first; a frozen 7B base's step is launch-bound, each
    # micro-batch carrying ~200 ms of CPU time whatever its tokens (H200, 2026-12-02: at 512
    # tokens, mb 4 with checkpointing 9,710 tokens/s against 2,824 for mb 1 without and 4,455
    # for mb 2 without; at 2048, mb 2 with 12,924 against 11,250 for mb 1 without).
    # LoRA's chunk shrinks before checkpointing is turned on (`loss_chunks`).
    chunks = loss_chunks(cfg, fp)
    order = ([(m, c, k) for m in sizes for c in levels for k in chunks]
             if fp.trainable_params is not None else
             [(m, c, chunks[0]) for c in levels for m in sizes])
    for m, checkpointing, chunk in order:
        if fits(fp, cfg, micro_batch=m, grad_accum=sequences // m, checkpointing=checkpointing,
                loss_chunk_tokens=chunk):
            return BatchPlan(m, sequences // m,
                             None if chunk == cfg.loss_chunk_tokens else chunk)
    return BatchPlan(sizes[-1], sequences // sizes[-1])


def _from_inputs(inputs: dict) -> tuple[Footprint, dict]:
    from training.model.model import model_config

    fp = Footprint(model_config(inputs["model"], inputs["vocab_size"]), inputs["num_params"],
                   inputs["shard_size"], None, inputs["compiled"], inputs["world"],
                   inputs.get("trainable_params"), inputs.get("lora_dropout", False),
                   inputs.get("replicated_base", False))
    shape = {k: inputs[k] for k in ("micro_batch", "seq_len", "grad_accum", "reduce_dtype",
                                     "accum_dtype", "checkpointing", "zero2", "loss_chunk_tokens")}
    return fp, shape


def parts_from(inputs: dict) -> Parts:
    """The estimate's terms for a recorded calibration row's inputs (bench/calibrate.py)."""
    fp, shape = _from_inputs(inputs)
    return estimate_parts(fp, **shape)


def estimate_from(inputs: dict) -> int:
    """The estimate, with today's constants, for a recorded calibration row's inputs."""
    return parts_from(inputs).total
