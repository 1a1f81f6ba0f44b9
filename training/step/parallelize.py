"""FSDP2 sharding: one group per decoder layer, then the root, over a 1-D (FSDP) or 2-D (HSDP) mesh.

The root group holds the embeddings, the final norm and the tied LM head: tied weights must stay in
one group, and the root is gathered once per step anyway. Order follows torchtitan: activation
checkpointing wraps the layers first, then FSDP shards them.

LoRA adapters stay inside their decoder layer's group, beside the frozen base they adapt. FSDP2
keeps gradients per parameter, so frozen weights in a group get no gradient buffer and no
reduce-scatter (FSDP1's flat parameters are why torchtune once wrapped adapters apart; its FSDP2
recipe, recipes/lora_finetune_distributed.py, shards per layer). Only the trainable parameters
of a group must share one original dtype (`FSDPParamGroup._init_mp_dtypes`, read in 2.13
and older copies): fp32 adapters beside a bf16 base are allowed, and with a bf16 `param_dtype` every
all-gather input is bf16, so one all-gather (`_get_all_gather_input_metadatas`). A group without
trainable parameters (the root under LoRA) has no reduce dtype (see `reduce_in`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from training.model.model import CausalLMWithLoss

REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def mixed_precision(device: torch.device, reduce_dtype: str = "fp32",
                    accum_dtype: str | None = None) -> MixedPrecisionPolicy | None:
    """bf16 compute with fp32 master weights on GPU, pure fp32 on CPU (see `precision_policy`)."""
    if device.type != "cuda":
        return None
    return precision_policy(reduce_dtype, accum_dtype)


def precision_policy(reduce_dtype: str, accum_dtype: str | None) -> MixedPrecisionPolicy:
    """bf16 parameters for compute; gradients accumulate across micro-batches in `accum_dtype`
    (default: `reduce_dtype`) and are reduced in `reduce_dtype` (bf16 halves the bytes on the wire;
    the optimizer still steps fp32 shards).

    FSDP2 accumulates the unsharded gradients of micro-batches without sync in the policy's
    reduce dtype (`FSDPParam.to_accumulated_grad_if_needed`; a reduce dtype equal to the param
    dtype means plain bf16 `+=`), so fp32 accumulation takes a policy with fp32 reduce; a bf16
    wire then comes from `reduce_in`."""
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                reduce_dtype=REDUCE_DTYPES[accum_dtype or reduce_dtype])


def reduce_in(model: nn.Module, dtype: str) -> None:
    """Reduce the gradients of every FSDP2 group in `dtype`, whatever they accumulated in.

    FSDP2 has no public setting for a reduce dtype other than the accumulation dtype. Each
    parameter group passes its `_reduce_dtype` to `foreach_reduce`, which copies the (fp32)
    accumulated gradients into a reduce-scatter buffer of that dtype, reduce-scatters (and, for
    HSDP, all-reduces) in it and casts the result back into the fp32 sharded gradients
    (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py `post_backward`,
    `_fsdp_collectives.py` `foreach_reduce`, torch 2.11 and 2.13). The attribute is re-derived
    from the policy at lazy init (`_init_mp_dtypes`, once per model), so call this after it."""
    wanted = REDUCE_DTYPES[dtype]
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:  # torch 2.11: one group per state
            groups = [state._fsdp_param_group] if state._fsdp_param_group else []
        for group in groups:
            if not hasattr(group, "_reduce_dtype"):
                raise RuntimeError(f"torch {torch.__version__}: FSDP2 parameter groups have no "
                                   "_reduce_dtype; --accum-dtype cannot differ from "
                                   "--reduce-dtype with this version")
            if group._reduce_dtype is not None:  # None: no trainable parameters
                group._reduce_dtype = wanted


def reduce_in_after_lazy_init(model: nn.Module, dtype: str) -> None:
    """`reduce_in` at the root's first forward, right after FSDP2's lazy init there.

    Not at build time: lazy init refuses meta parameters (`FSDPParamGroup.lazy_init` ->
    `_validate_no_meta_params`), and a pretrained --model is still on the meta device until
    `loading.load_sharded` fills it after sharding. FSDP2 registers the root's pre-forward hook
    with `prepend=True` (torch/distributed/fsdp/_fully_shard/_fsdp_state.py, `FSDPState.init`,
    read in torch 2.13; `bench/device-run.sh pretrained` runs it on the GPU machine's 2.11), so
    a hook registered after it runs after the lazy init, once."""
    def once(module: nn.Module, _args) -> None:
        handle.remove()
        reduce_in(module, dtype)

    handle = model.register_forward_pre_hook(once)


def shard_model(model: CausalLMWithLoss, device: torch.device, *, reshard_after_forward: bool,
                activation_checkpointing: bool, compile_layers: bool = False,
                mesh: DeviceMesh | None = None, reduce_dtype: str = "fp32",
                accum_dtype: str | None = None, prefetch_layers: int = 0,
                policy: MixedPrecisionPolicy | None = None,
                replicate_frozen: bool = False) -> CausalLMWithLoss:
    """Shard in place over `mesh` (default: the whole default process group) and return the model;
    `policy` overrides the device's mixed precision (bf16 on CPU, for tests).

    `replicate_frozen` (LoRA): FSDP2 leaves the frozen parameters alone (`fully_shard`'s
    `ignored_params`: "not sharded, nor moved to the device during init, nor have their gradients
    reduced", torch/distributed/fsdp/_fully_shard/_fully_shard.py, torch 2.7 and later), so every
    rank keeps the whole bf16 base and no step all-gathers it: no gathered copies beside the
    shards (the root's embeddings and LM head, a layer or two) and no copy-in/all-gather/copy-out
    per layer and micro-batch, which on one GPU is pure overhead. Only the adapters are sharded
    and reduce-scattered."""
    kwargs = {"mesh": mesh}
    policy = policy or mixed_precision(device, reduce_dtype, accum_dtype)
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
        fully_shard(layer, reshard_after_forward=reshard_after_forward and not last,
                    **kwargs, **_ignored(layer, replicate_frozen))
    fully_shard(model, **kwargs, **_ignored(model, replicate_frozen))
    # The training step divides its loss by the labelled tokens of all ranks (engine.train_step),
    # so the reduction sums gradients instead of averaging them over ranks, as torchtitan does.
    # A factor of 1 alone becomes NCCL's PREMUL_SUM(1), which gloo refuses; with sum-only
    # comms it is a plain SUM and no division (_fsdp_collectives.py, _get_gradient_divide_factors).
    # Set on every FSDP module: each setter covers only its own module's parameter group
    # (torch/distributed/fsdp/_fully_shard/_fully_shard.py, read in 2.13).
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    if policy is not None and accum_dtype not in (None, reduce_dtype):
        reduce_in_after_lazy_init(model, reduce_dtype)
    if prefetch_layers:
        set_prefetch(list(layers), prefetch_layers)
    return model


def _ignored(module: nn.Module, replicate_frozen: bool) -> dict:
    """`fully_shard`'s keyword that keeps `module`'s frozen parameters out of FSDP2."""
    if not replicate_frozen:
        return {}
    return {"ignored_params": {p for p in module.parameters() if not p.requires_grad}}


def set_prefetch(layers: list, depth: int) -> None:
    """Each layer explicitly prefetches the all-gathers of the next `depth` layers in forward and
    of the previous `depth` in backward (FSDPModule.set_modules_to_{forward,backward}_prefetch:
    one layer matches FSDP2's implicit overlap, issued earlier from the CPU; two or more overlap
    more at one gathered layer of memory each)."""
    for i, layer in enumerate(layers):
        layer.set_modules_to_forward_prefetch(layers[i + 1:i + 1 + depth])
        layer.set_modules_to_backward_prefetch(layers[max(0, i - depth):i][::-1])
