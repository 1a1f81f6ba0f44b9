"""FSDP2 sharding: one group per decoder layer, then the root.

The root group holds the embeddings, the final norm and the tied LM head: tied weights must stay in
one group, and the root is gathered once per step anyway. Order follows torchtitan: activation
checkpointing wraps the layers first, then FSDP shards them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.model import CausalLMWithLoss


def mixed_precision(device: torch.device) -> MixedPrecisionPolicy | None:
    """bf16 compute, fp32 master weights and fp32 gradient reduction on GPU; pure fp32 on CPU."""
    if device.type != "cuda":
        return None
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard_model(model: CausalLMWithLoss, device: torch.device, *, reshard_after_forward: bool,
                activation_checkpointing: bool, compile_layers: bool = False) -> CausalLMWithLoss:
    """Shard in place across the default process group and return the model."""
    kwargs = {}
    policy = mixed_precision(device)
    if policy is not None:
        kwargs["mp_policy"] = policy
    layers: nn.ModuleList = model.layers
    for i, layer in enumerate(layers):
        if activation_checkpointing:
            layer = checkpoint_wrapper(layer)
            layers[i] = layer
        if compile_layers:
            layer.compile()
        # The last layer is gathered again right away by backward: keeping it saves one all-gather.
        last = i == len(layers) - 1
        fully_shard(layer, reshard_after_forward=reshard_after_forward and not last, **kwargs)
    fully_shard(model, **kwargs)
    return model
