"""Fused LM-head + cross-entropy that never holds the full logits.

Qwen's 151,936-word vocabulary makes fp32 logits ~5 GB at 8k tokens. This computes the loss chunk by
chunk and, in the same pass, the gradients for the hidden states and the head weight (the approach
of Liger's fused linear cross-entropy), so backward does no recompute and memory stays at one
chunk's logits.
"""

from __future__ import annotations

import functools

import torch


IGNORE_INDEX = -100  # labels left out of the loss, as torch.nn.functional.cross_entropy's default


def _chunk_loss_and_grads(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, n: torch.Tensor,
                          acc: torch.dtype, weight_grad: bool = True) -> tuple[torch.Tensor, ...]:
    """Summed loss of one chunk and its gradients for `h` and, when `weight_grad`, `weight` (of
    the mean over the `n` counted labels of the whole batch; IGNORE_INDEX labels add nothing).

    Written so that torch.compile can fuse the upcast, log-sum-exp, softmax and one-hot
    subtraction into a couple of kernels around the two matmuls; eager runs it in place.
    """
    counted = (y != IGNORE_INDEX).to(acc)
    y = y.clamp(min=0)
    logits = (h @ weight.t()).to(acc)
    lse = torch.logsumexp(logits, dim=-1)
    loss = ((lse - logits.gather(1, y[:, None]).squeeze(1)) * counted).sum()
    # d(mean loss)/d(logits) = (softmax - one_hot) / n, computed in place.
    grad_logits = logits.sub_(lse[:, None]).exp_()
    grad_logits[torch.arange(len(y), device=y.device), y] -= 1.0
    grad_logits = grad_logits.mul_((counted / n)[:, None]).to(h.dtype)
    return loss, grad_logits @ weight, (grad_logits.t() @ h).to(acc) if weight_grad else None


@functools.cache
def _compiled_chunk():
    return torch.compile(_chunk_loss_and_grads)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                chunk: int, compiled: bool, normalizer: torch.Tensor | None) -> torch.Tensor:
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32, or fp64 when given fp64
        n = label_count(labels) if normalizer is None else normalizer
        n = n.clamp(min=1).to(acc)  # no host sync
        step = _compiled_chunk() if compiled else _chunk_loss_and_grads
        # A frozen head (LoRA) needs no vocab x hidden fp32 gradient: 2.2 GB for Qwen2.5-7B.
        weight_grad = ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) \
            if weight_grad else None
        loss = torch.zeros((), dtype=acc, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            chunk_loss, grad_h, grad_w = step(hidden[start:start + chunk], weight,
                                              labels[start:start + chunk], n, acc, weight_grad)
            loss += chunk_loss
            grad_hidden[start:start + chunk] = grad_h
            if weight_grad:
                grad_weight += grad_w
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss / n

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        weight = None if grad_weight is None else (grad_weight * grad_loss).to(ctx.weight_dtype)
        return grad_hidden * grad_loss.to(grad_hidden.dtype), weight, None, None, None, None


def label_count(labels: torch.Tensor) -> torch.Tensor:
    """How many labels the loss counts (a device tensor: no host sync)."""
    return (labels != IGNORE_INDEX).sum()


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                               chunk_tokens: int, compiled: bool = False,
                               normalizer: torch.Tensor | None = None) -> torch.Tensor:
    """Summed next-token loss of `hidden @ weight.T` against `labels` (shapes [N, H], [V, H], [N])
    over the labels that are not IGNORE_INDEX, divided by `normalizer` (default: their count, a
    mean); `compiled` runs each chunk's step through torch.compile."""
    return _FusedLinearCrossEntropy.apply(hidden, weight, labels, chunk_tokens, compiled,
                                          normalizer)
