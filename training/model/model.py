"""Model construction: built-in random-init shapes (Qwen2.5, Llama 3.1, Qwen3, Gemma 3, Ministral) or Hugging Face checkpoints.

Single-device code with no knowledge of parallelism (`parallelize.py` shards it). The model is
wrapped in `CausalLMWithLoss` so that the LM head and the loss run inside the FSDP root module's
forward: the root group (embeddings, final norm, tied LM head) is gathered by FSDP's own hooks.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, Qwen2Config

from training.errors import first_line
from training.model.loading import ModelError, check_model_dir, is_s3, local_dir, looks_like_path
from training.model.loss import fused_linear_cross_entropy, label_count

# Random-init shapes from the published configs, for planning and benchmarking without weights.
# Qwen2.5: Qwen/Qwen2.5-{0.5B,1.5B,7B} config.json; `tiny` keeps the architecture (GQA, tied
# embeddings, RMSNorm, SwiGLU) at a size that trains on a laptop CPU. A shape without a
# `model_type` is Qwen2 with tied embeddings.
BUILTIN_SHAPES: dict[str, dict] = {
    "tiny": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    # Qwen/Qwen2.5-7B config.json: untied LM head; for planning and benchmarking 7B LoRA without
    # its weights.
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=False),
    # meta-llama/Llama-3.1-8B config.json (its llama3 RoPE scaling left out: no effect on
    # memory or speed).
    "llama3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336,
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                        vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                        rope_theta=500000.0, tie_word_embeddings=False),
    # Qwen/Qwen3-8B config.json: head_dim 128 (not hidden / heads), QK-norm.
    "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # google/gemma-3-12b-pt config.json's text_config (the text decoder of the multimodal
    # checkpoint): head_dim 256, a 1,024-token window on 5 of every 6 layers, tied embeddings.
    "gemma3-12b": dict(model_type="gemma3_text", hidden_size=3840, intermediate_size=15360,
                       num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=256, vocab_size=262208, max_position_embeddings=131072,
                       sliding_window=1024, query_pre_attn_scalar=256, rms_norm_eps=1e-6),
    # mistralai/Ministral-8B-Instruct-2410 (its model card's architecture table: 36 layers,
    # dim 4096, hidden 12288, 32 heads, 8 KV heads, head dim 128, vocabulary 131,072; windows
    # of 32k on three of every four layers).
    "ministral-8b": dict(model_type="ministral", hidden_size=4096, intermediate_size=12288,
                         num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128, vocab_size=131072, max_position_embeddings=131072,
                         sliding_window=32768, rope_theta=100000000.0, rms_norm_eps=1e-5,
                         layer_types=["sliding_attention" if i % 4 else "full_attention"
                                      for i in range(36)]),
}


def is_builtin(spec: str) -> bool:
    return spec in BUILTIN_SHAPES


def model_config(spec: str, vocab_size: int | None = None) -> PretrainedConfig:
    """The architecture for `spec`; built-in shapes take the tokenizer's vocabulary when given."""
    if is_builtin(spec):
        shape = dict(BUILTIN_SHAPES[spec])
        if vocab_size:
            shape["vocab_size"] = vocab_size
        model_type = shape.pop("model_type", None)
        config = (AutoConfig.for_model(model_type, **shape) if model_type else
                  Qwen2Config(**{"tie_word_embeddings": True, **shape}))
    else:
        if is_s3(spec) or Path(spec).is_dir():
            check_model_dir(spec)
        elif looks_like_path(spec):
            raise ModelError(f"--model {spec!r}: no such model directory")
        try:
            config = AutoConfig.from_pretrained(local_dir(spec))
        except (OSError, ValueError) as e:
            raise ModelError(f"--model {spec!r}: cannot load its config ({first_line(e)}); "
                             "pass a Hugging Face id, a local model directory, or a built-in "
                             f"shape {sorted(BUILTIN_SHAPES)}") from None
    if getattr(config, "quantization_config", None):
        from training.config import QLORA_REFUSED

        raise ModelError(f"--model {spec!r} is a quantized model (its config has a "
                         f"quantization_config): {QLORA_REFUSED}")
    config.use_cache = False
    return config


def max_positions(config: PretrainedConfig) -> int:
    return int(getattr(config, "max_position_embeddings", 0) or 0)


def build_model(spec: str, config: PretrainedConfig, *, seed: int,
                device: torch.device | None = None, attention: str = "sdpa",
                dtype: torch.dtype = torch.float32) -> nn.Module:
    """Random init (same weights on every rank, from `seed`) in `dtype`, or, for pretrained
    weights, the bare architecture on the meta device (training/model/loading.py fills it after
    sharding).

    fp32 by default: these are the master weights; FSDP2's mixed-precision policy casts to bf16
    for compute on GPU. A frozen LoRA base is built in bf16 (no master copy: a 7B base in fp32
    would not fit an L4 before sharding). Random init happens directly on `device` (seconds, not
    minutes, for 1.5B).
    """
    torch.manual_seed(seed)
    with torch.device("meta" if not is_builtin(spec) else device or "cpu"):
        return AutoModelForCausalLM.from_config(config, attn_implementation=attention,
                                                dtype=dtype)


def count_params(model: nn.Module) -> int:
    """Parameters counted once each (a tied LM head counts once: its matmul is the FLOPs)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """{alias: canonical} for parameters registered under two names (the tied LM head)."""
    first: dict[int, str] = {}
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = first[id(p)]
        else:
            first[id(p)] = name
    return out


class CausalLMWithLoss(nn.Module):
    """Decoder + tied LM head + next-token loss in one forward, without full logits."""

    def __init__(self, lm: nn.Module, loss_chunk_tokens: int, compile_loss: bool = False):
        super().__init__()
        self.lm = lm
        self.loss_chunk_tokens = loss_chunk_tokens
        self.compile_loss = compile_loss

    @property
    def layers(self) -> nn.ModuleList:
        return self.lm.model.layers

    def hidden(self, input_ids: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """The decoder's last hidden states. Per-document `positions` with no attention mask
        and no cache make transformers mask attention block-diagonally (masking_utils.py:
        `find_packed_sequence_indices` runs only when `attention_mask` and `past_key_values`
        are None; a model left at `use_cache=True` builds a cache in its forward and stays
        causal across documents, measured in transformers 5.17)."""
        return self.lm.model(input_ids=input_ids, position_ids=positions, attention_mask=None,
                             use_cache=False).last_hidden_state

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor,
                positions: torch.Tensor | None = None,
                normalizer: torch.Tensor | None = None,
                per_token_logps: bool = False) -> torch.Tensor:
        """The summed loss over the counted labels divided by `normalizer` (default: their
        count, the mean); `per_token_logps`: instead each label's log-probability ([B, T], 0
        where none; --objective dpo, model/dpo.py), inside this root module's forward so that
        FSDP2 gathers the root's weights for it."""
        hidden = self.hidden(input_ids, positions)
        if per_token_logps:
            from training.model.dpo import token_logps

            return token_logps(hidden, self.lm.lm_head.weight, labels, self.loss_chunk_tokens)
        if not self.loss_chunk_tokens:  # unfused baseline: full fp32 logits
            logits = self.lm.lm_head(hidden).float()
            total = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                reduction="sum")
            n = label_count(labels) if normalizer is None else normalizer
            return total / n.clamp(min=1)
        return fused_linear_cross_entropy(hidden.flatten(0, 1), self.lm.lm_head.weight,
                                          labels.flatten(), self.loss_chunk_tokens,
                                          self.compile_loss, normalizer)

