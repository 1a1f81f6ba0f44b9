"""Direct Preference Optimization: the sigmoid loss of Rafailov et al. (2023) on the pairs of a
micro-batch, as TRL's `DPOTrainer` computes it (trl/trainer/dpo_trainer.py `_compute_loss`,
`loss_type="sigmoid"`, `f_divergence_type="reverse_kl"`), and its metrics under TRL's names.

A row holds pairs (training/data/preference.py): each pair's chosen conversation, then its
rejected one, each a document of its own (positions restart, so none attends to another:
model.py's block-diagonal mask). A sequence's log-probability is the sum of its answer tokens'
log-probabilities (TRL: `per_token_logps.sum(dim=1)` over the completion mask), and

    loss = -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))

averaged over the step's pairs; the rewards are `beta * (pi - ref)` of each answer, detached.

The log-probabilities come from the decoder's hidden states chunk by chunk (`answer_logps`):
each chunk's logits live only inside the chunk's forward and are recomputed in backward, so
no full [tokens, vocab] logits tensor is ever held (as with the SFT loss, loss.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F

from training.model.loss import IGNORE_INDEX
from training.model.rewards import REWARD_METRICS



class _ChunkedLogps(torch.autograd.Function):
    """Per-token log p(label) of `hidden @ weight.T` (0 where the label is IGNORE_INDEX), in
    chunks; backward recomputes each chunk's softmax: d logp_t / d logits = onehot - softmax."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk: int):
        """`hidden` [N, H], `labels` [B, T] with B * T = N: the output is [B, T] and no view
        (FSDP2 warns of a view returned from its root's forward: an in-place op on it would
        skip the pre-backward hook)."""
        out = torch.zeros(labels.shape, dtype=torch.float32, device=hidden.device)
        flat, labels = out.view(-1), labels.reshape(-1)
        for s in range(0, hidden.shape[0], chunk):
            logits = (hidden[s:s + chunk] @ weight.t()).float()
            y = labels[s:s + chunk]
            picked = logits.gather(1, y.clamp(min=0)[:, None]).squeeze(1)
            flat[s:s + chunk] = (picked - torch.logsumexp(logits, -1)) * (y != IGNORE_INDEX)
        ctx.save_for_backward(hidden, weight, labels)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, labels = ctx.saved_tensors
        grad_out = grad_out.reshape(-1)
        need_w = ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if need_w else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            h, y = hidden[s:s + ctx.chunk], labels[s:s + ctx.chunk]
            g = grad_out[s:s + ctx.chunk] * (y != IGNORE_INDEX)
            grad_logits = -torch.softmax((h @ weight.t()).float(), -1) * g[:, None]
            grad_logits[torch.arange(len(y), device=y.device), y.clamp(min=0)] += g
            grad_logits = grad_logits.to(h.dtype)
            grad_h[s:s + ctx.chunk] = grad_logits @ weight
            if need_w:
                grad_w += (grad_logits.t() @ h).float()
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None


def token_logps(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                chunk_tokens: int) -> torch.Tensor:
    """log p(label) of every position of `hidden` [B, T, H] ([B, T]; 0 where not a label)."""
    return _ChunkedLogps.apply(hidden.flatten(0, 1), weight, labels,
                               chunk_tokens or hidden.shape[0] * hidden.shape[1])


def segments(positions: torch.Tensor) -> torch.Tensor:
    """Which document of its row each label belongs to (2k: pair k's chosen, 2k+1: its
    rejected, beyond the row's pairs: padding): the label at t is token t+1's, of the document
    token t is in, unless t+1 starts a document (then it is no label, packing.decode). A
    document starts where its position is 0."""
    return (positions == 0).cumsum(dim=1) - 1


def by_pair(values: torch.Tensor, positions: torch.Tensor, pairs: int) -> torch.Tensor:
    """Per-label `values` [B, T] summed per document into [B, pairs, 2] (chosen, rejected);
    padding documents fall into one spare bin, dropped."""
    seg = segments(positions).clamp(max=2 * pairs)
    out = torch.zeros(values.shape[0], 2 * pairs + 1, dtype=values.dtype, device=values.device)
    return out.scatter_add(1, seg, values)[:, :2 * pairs].reshape(-1, pairs, 2)


def answer_logps(model, inputs: torch.Tensor, labels: torch.Tensor,
                 positions: torch.Tensor, pairs: int = 1) -> torch.Tensor:
    """Summed answer log-probabilities of each row's pairs, chosen and rejected ([B, pairs,
    2]): `model` is the job's CausalLMWithLoss (its decoder, LM head and loss chunk)."""
    per_token = model(inputs, labels, positions, per_token_logps=True)
    return by_pair(per_token, positions, pairs)


@dataclass
class PairStats:
    """Sums over pairs (device tensors, no sync): loss, rewards, correct orderings, margins,
    and the pair count; `means` turns them into TRL's metrics."""
    sums: torch.Tensor | None = None  # [loss, chosen, rejected, accurate, margin, pairs]

    def add(self, losses: torch.Tensor, chosen: torch.Tensor, rejected: torch.Tensor,
            counted: torch.Tensor) -> None:
        c = counted.float()
        row = torch.stack([(losses * c).sum(), (chosen * c).sum(), (rejected * c).sum(),
                           ((chosen > rejected).float() * c).sum(),
                           ((chosen - rejected) * c).sum(), c.sum()]).detach().double()
        self.sums = row if self.sums is None else self.sums + row

    def means(self, prefix: str = "") -> dict[str, float]:
        """TRL's metrics (`prefix` `eval_` for the evaluation's), all-reduced across ranks."""
        import torch.distributed as dist

        sums = self.sums.clone()
        if dist.is_initialized():
            dist.all_reduce(sums)
        n = max(float(sums[5]), 1.0)
        values = [float(v) / n for v in sums[1:5]]
        return {f"{prefix}{name}": v for name, v in zip(REWARD_METRICS, values)}


@dataclass
class DpoObjective:
    """What the training step (step/engine.py `train_step`) runs per micro-batch for
    `--objective dpo`: the count of pairs it normalizes by, and the loss of one micro-batch,
    summed over its pairs and divided by the step's pair count (a mean over the step).

    The reference log-probabilities come with the batch (full fine-tuning: computed once
    before training, training/run/reference_logps.py) or, with LoRA, from the same model with
    its adapters off (TRL: `use_adapter(model, None)` for a new adapter, i.e. PEFT's
    `disable_adapter`; peft/tuners/lora/layer.py: a disabled layer returns `base_layer(x)`)."""
    beta: float
    stats: PairStats = field(default_factory=PairStats)
    # the share of a row's tokens that are pairs' (not the row end's padding): tokens/s and MFU
    # count those (run/trainer.py)
    real_share: float = 1.0

    @staticmethod
    def count(batch) -> torch.Tensor:
        return pair_mask(batch.labels, batch.positions, batch.pairs).sum()

    def reference(self, model, batch) -> torch.Tensor:
        if batch.ref is not None:
            return batch.ref
        with torch.no_grad(), adapters_off(model), eval_mode(model):
            return answer_logps(model, batch.inputs, batch.labels, batch.positions, batch.pairs)

    def loss(self, model, batch, normalizer: torch.Tensor) -> torch.Tensor:
        ref = self.reference(model, batch)
        policy = answer_logps(model, batch.inputs, batch.labels, batch.positions, batch.pairs)
        losses, chosen, rejected = sigmoid_loss(policy, ref, self.beta)
        counted = pair_mask(batch.labels, batch.positions, batch.pairs)
        self.stats.add(losses, chosen, rejected, counted)
        return (losses * counted).sum() / normalizer.clamp(min=1)


def sigmoid_loss(policy: torch.Tensor, ref: torch.Tensor, beta: float):
    """Per-pair loss and the two rewards from [..., 2] (chosen, rejected) log-probabilities."""
    ratios = policy - ref.to(policy.dtype)
    losses = -F.logsigmoid(beta * (ratios[..., 0] - ratios[..., 1]))
    return losses, beta * ratios[..., 0].detach(), beta * ratios[..., 1].detach()


def pair_mask(labels: torch.Tensor, positions: torch.Tensor, pairs: int = 1) -> torch.Tensor:
    """[B, pairs]: the pair slots that hold a pair (both answers have a label); a row's unused
    slots and evaluation's padding rows hold none."""
    counted = by_pair((labels != IGNORE_INDEX).float(), positions, pairs)
    return (counted > 0).all(-1)


@contextlib.contextmanager
def eval_mode(model) -> Iterator[None]:
    """`model` in eval mode (no dropout) while inside, then back in the mode it was in: every
    evaluation (SFT's and DPO's) and every reference log-probability is computed so, as TRL's
    `disable_dropout=True` and HF Trainer's `evaluation_loop` do. With dropout on, a reference
    would otherwise be a noisy draw, differ between two passes over the same pairs, and take
    draws from the training RNG."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


class adapters_off:
    """Every PEFT layer of `model` computes its base layer alone while inside (the flag PEFT's
    `BaseTunerLayer.enable_adapters(False)` sets, peft/tuners/tuners_utils.py, without its
    requires_grad changes: the reference runs under no_grad)."""

    def __init__(self, model):
        self.layers = [m for m in model.modules() if hasattr(m, "_disable_adapters")]

    def __enter__(self):
        for m in self.layers:
            m._disable_adapters = True

    def __exit__(self, *exc):
        for m in self.layers:
            m._disable_adapters = False
