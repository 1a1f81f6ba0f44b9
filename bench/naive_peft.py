"""The naive PEFT baseline of bench.lora: how a LoRA run looks without this project's step.

A plain Hugging Face causal LM (the same random-init shape, bf16, on the whole GPU), wrapped by
`peft.get_peft_model` with the run's LoRA settings, Hugging Face's own gradient checkpointing
(`gradient_checkpointing_enable`, non-reentrant, as TRL's SFTTrainer enables it by default through
`TrainingArguments.gradient_checkpointing`) and the loss over the full logits: the LM head's
output for every token, upcast to fp32, then cross-entropy (transformers'
`ForCausalLMLoss` does the same upcast). No FSDP, no compile, fused AdamW on the adapters.
The loss is the step's token mean, as ours (training/step/engine.train_step), over the same
packed rows with the same per-document positions, so no token attends across a document and
both train the same loss (TRL's padding-free packing passes `position_ids` the same way);
`causal` leaves the positions out, as the baseline did until 2026-12-02: every row one causal
sequence, a cheaper attention and another loss.
"""

from __future__ import annotations

import math
import time


def build(cfg, device, dtype=None):
    """The PEFT model and its optimizer, from the run's TrainConfig; the base in `dtype`
    (default bf16, what the baseline trains in; tests pass fp32)."""
    import torch
    from peft import get_peft_model

    from training.model import lora
    from training.model.model import build_model, model_config

    spec = lora.LoraSpec.from_config(cfg)
    lm = build_model(cfg.model, model_config(cfg.model), seed=cfg.seed, device=device,
                     attention=cfg.attention, dtype=dtype or torch.bfloat16)
    lm = get_peft_model(lm, spec.peft_config())
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.config.use_cache = False
    # PEFT keeps the adapters fp32 beside a bf16 base (get_peft_model's autocast_adapter_dtype)
    trainable = [p for p in lm.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, betas=(0.9, 0.95),
                                  fused=device.type == "cuda")
    return lm, optimizer, sum(p.numel() for p in trainable)


def logits(lm, batch, device, causal: bool = False):
    """The model's logits for a micro-batch: per-document attention from its positions (no
    attention mask and no cache, as CausalLMWithLoss.hidden calls the model), or `causal`."""
    import torch

    positions = None if causal else batch.positions
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        return lm(input_ids=batch.inputs, position_ids=positions, attention_mask=None,
                  use_cache=False).logits


def step(lm, optimizer, micro_batches, device, causal: bool = False) -> float:
    """One optimizer step over the micro-batches; the step's token-mean loss (syncs)."""
    import torch.nn.functional as F

    batches = [b.to(device) for b in micro_batches]
    count = sum(int((b.labels != -100).sum()) for b in batches)
    total = 0.0
    for b in batches:
        out = logits(lm, b, device, causal).float()
        loss = F.cross_entropy(out.flatten(0, 1), b.labels.flatten(), ignore_index=-100,
                               reduction="sum") / count
        loss.backward()
        total += float(loss.detach())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def train(cfg, samples, device, micro_batch: int, causal: bool = False) -> dict:
    """`cfg.steps` steps of `cfg.tokens_per_step` tokens in micro-batches of `micro_batch`:
    tokens/s after the first step, the losses, the trainable count."""
    lm, optimizer, trainable = build(cfg, device)
    accum = max(1, cfg.tokens_per_step // (micro_batch * cfg.seq_len))
    losses, seen, started = [], 0, time.perf_counter()
    for n in range(1, cfg.steps + 1):
        micro = [samples.batch(seen, rank=0, world=1, micro=m, batch=micro_batch)
                 for m in range(accum)]
        seen += micro_batch * accum
        losses.append(step(lm, optimizer, micro, device, causal))
        if n == 1:
            started = time.perf_counter()
    tokens = (cfg.steps - 1) * micro_batch * accum * cfg.seq_len
    return {"tokens_per_s": tokens / (time.perf_counter() - started), "losses": losses,
            "first_loss": losses[0], "last_loss": sum(losses[-3:]) / len(losses[-3:]),
            "losses_finite": all(math.isfinite(x) for x in losses),
            "plan": {"micro_batch_size": micro_batch, "grad_accum": accum,
                     "naive": "peft + HF gradient checkpointing + full logits",
                     "attention": "sdpa, causal rows" if causal else "sdpa, per document"},
            "trainable_params": trainable}
