"""LoRA adapters (PEFT's) on the job's model: injected, trained, checkpointed and exported.

PEFT's `inject_adapter_in_model` (peft/mapping.py) replaces each target `nn.Linear` in place by
a LoRA layer (peft/tuners/lora/layer.py, `update_layer`): the original weight moves to
`<name>.base_layer`, the adapters are `<name>.lora_A.default` (r x in, kaiming-uniform) and
`<name>.lora_B.default` (out x r, zeros), and the layer computes `base(x) + scaling *
B(A(dropout(x)))` with scaling `alpha / r`. The model keeps its class and module tree, so
`CausalLMWithLoss`, FSDP2's one group per decoder layer (the adapters inside their layer's
group: training/step/parallelize.py) and the pretrained-weight broadcast work unchanged.

Only the adapters train: the base is frozen and held in bf16 on GPU (no fp32 master copy, no
gradient, no Adam state); the adapters are fp32 master weights, as full fine-tuning's are.
The export writes PEFT's adapter format (keys `base_model.model.<name>.lora_A.weight`, what
`PeftModel.save_pretrained` writes through `get_peft_model_state_dict`,
peft/utils/save_and_load.py) and the merged weights `W + scaling * B @ A`, computed in fp32
(what `merge_and_unload` computes: `get_delta_weight`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import torch
from torch import nn

from training.errors import ConfigError

ADAPTER = "default"  # PEFT's adapter name; its files leave it out of their keys
ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"
PEFT_PREFIX = "base_model.model."  # PeftModel.base_model (LoraModel).model (the model)
DECODER_LAYERS = "model.layers."
_A, _B, _BASE = f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight", ".base_layer"


@dataclass(frozen=True)
class LoraSpec:
    """A run's adapters; also their identity in its checkpoints (a resume must match it)."""
    rank: int
    alpha: float
    dropout: float
    targets: tuple[str, ...]
    base: str  # --model: the frozen weights the adapters belong to

    @classmethod
    def from_config(cls, cfg) -> "LoraSpec | None":
        """The run's adapters, or None for full fine-tuning (--lora-rank 0)."""
        if not cfg.lora_rank:
            return None
        return cls(cfg.lora_rank, float(cfg.lora_alpha), float(cfg.lora_dropout),
                   tuple(target_names(cfg.lora_target_modules)), cfg.model)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def peft_config(self, base_name: str | None = None):
        from peft import LoraConfig

        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=list(self.targets), bias="none", task_type="CAUSAL_LM",
                          base_model_name_or_path=base_name)


def with_family_targets(cfg, config):
    """`cfg` with the model family's own LoRA targets (model/families.py) where
    --lora-target-modules was left at the default and the family names its projections
    otherwise (Phi-3's fused `qkv_proj`/`gate_up_proj`, Qwen3.5's linear-attention
    projections); the workers build their adapters from the returned settings."""
    import dataclasses

    from training.config import LORA_TARGETS
    from training.model.families import lora_targets

    targets = lora_targets(config)
    if not cfg.lora_rank or cfg.lora_target_modules != LORA_TARGETS or targets is None:
        return cfg
    return dataclasses.replace(cfg, lora_target_modules=",".join(targets))


def target_names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def apply(lm: nn.Module, spec: LoraSpec, base_dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """Inject the adapters into `lm` in place (their init drawn from `seed`, the same on every
    rank and however the base was made): they alone require gradients, in fp32; the base's
    parameters are cast to `base_dtype` (meta tensors stay on meta), its buffers are not: the
    rotary `inv_freq` stays fp32, as `from_pretrained(dtype=torch.bfloat16)` keeps it (the
    rotary embedding computes it in `torch.float`: Qwen2RotaryEmbedding.compute_default_rope_
    parameters, transformers 5.13 models/qwen2/modeling_qwen2.py) and as the export is
    then used; `lm.to(bf16)` would train on a bf16 RoPE (relative error ~4e-3 in the
    frequencies, whole radians off at long distances). Targets the model lacks are a
    ConfigError naming its linear layers."""
    from peft import inject_adapter_in_model

    linear = sorted({n.rsplit(".", 1)[-1] for n, m in lm.named_modules()
                     if isinstance(m, nn.Linear)})
    cast_parameters(lm, base_dtype)
    torch.manual_seed(seed)
    try:  # PEFT refuses targets of which none matches, and takes the rest when one does
        inject_adapter_in_model(spec.peft_config(), lm, adapter_name=ADAPTER)
    except ValueError:
        pass
    adapted = [n for n, m in lm.named_modules() if hasattr(m, "lora_A")]
    unmatched = [t for t in spec.targets
                 if not any(n == t or n.endswith("." + t) for n in adapted)]
    if unmatched:
        raise ConfigError([f"--lora-target-modules: no layer named {','.join(unmatched)} in "
                           f"this model (its linear layers: {','.join(linear)})"])
    outside = [n for n in adapted if not n.startswith(DECODER_LAYERS)]
    if outside:
        raise ConfigError([f"--lora-target-modules {','.join(spec.targets)}: adapters only "
                           f"inside the decoder layers (got {', '.join(outside)}): the fused "
                           "loss reads the LM head's weight itself, and FSDP shards per layer"])
    for name, p in lm.named_parameters():
        p.requires_grad_(is_adapter(name))
    for module in lm.modules():  # PEFT gives the adapters the base's dtype
        if hasattr(module, "lora_A") and hasattr(module, "lora_B"):
            module.lora_A.float()
            module.lora_B.float()
    return lm


def cast_parameters(lm: nn.Module, dtype: torch.dtype) -> None:
    """Every floating parameter of `lm` in `dtype` (a tied one once), its buffers left as they
    are: what `nn.Module.to(dtype)` does without touching the fp32 rotary buffers."""
    with torch.no_grad():
        for p in lm.parameters():
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def adapter_state(full: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The adapters of a full state dict of the injected model (its keys without `lm.`), in
    PEFT's file format: `base_model.model.` in front, the adapter name left out."""
    return {PEFT_PREFIX + k.replace(f".{ADAPTER}.", "."): v.to(dtype).contiguous()
            for k, v in full.items() if is_adapter(k)}


def merged_state(full: dict[str, torch.Tensor], spec: LoraSpec,
                 dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The plain model's state dict with each adapted weight replaced by W + scaling * B @ A
    (in fp32, then cast to `dtype`); `.base_layer` keys get their original names back."""
    out = {}
    for key, value in full.items():
        if is_adapter(key):
            continue
        if _BASE in key:
            module = key.split(_BASE)[0]
            if key.endswith(".weight"):
                delta = full[module + _B].float() @ full[module + _A].float()
                value = value.float() + spec.scaling * delta
            key = key.replace(_BASE, "")
        out[key] = value.to(dtype)
    return out


def write_adapter(directory: str, adapters: dict[str, torch.Tensor], spec: LoraSpec,
                  base_name: str | None) -> None:
    """A PEFT adapter directory: `adapter_config.json` + `adapter_model.safetensors`, loadable
    with `PeftModel.from_pretrained(<base model>, directory)`."""
    from safetensors.torch import save_file

    save_file(adapters, os.path.join(directory, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    spec.peft_config(base_name).save_pretrained(directory)


def count_on_meta(config, spec: LoraSpec | None) -> tuple[int, int]:
    """(all parameters, trainable ones) of the model `config` describes with `spec`'s adapters,
    counted on the meta device (no memory, no weights): what the memory planner needs before
    anything is built."""
    from transformers import AutoModelForCausalLM

    from training.model.model import count_params

    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config)
        if spec is not None:
            apply(lm, spec, torch.bfloat16)
    trainable = sum(p.numel() for p in lm.parameters() if p.requires_grad)
    return count_params(lm), trainable
