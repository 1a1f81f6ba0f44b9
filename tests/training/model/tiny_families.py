"""Tiny random configs of each supported family's real architecture (transformers' own config
classes, a few hundred thousand parameters), shared by the family tests."""

from __future__ import annotations

from training.model.families import FAMILIES

SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=300, max_position_embeddings=512,
             bos_token_id=1, eos_token_id=2, pad_token_id=0)
# Per family: what makes its tiny config exercise every layer type it has (a window shorter
# than the test's documents, so the window and the document mask both cut).
EXTRA = {
    "mistral": dict(sliding_window=6),
    "ministral": dict(sliding_window=6, layer_types=["sliding_attention", "full_attention"] * 2),
    "gemma3_text": dict(sliding_window=6, layer_types=["sliding_attention", "full_attention"] * 2),
    "olmo3": dict(sliding_window=6, layer_types=["sliding_attention", "full_attention"] * 2),
    "qwen3_5_text": dict(layer_types=["linear_attention", "full_attention"] * 2,
                         linear_num_key_heads=2, linear_num_value_heads=2,
                         linear_key_head_dim=16, linear_value_head_dim=16),
    "smollm3": dict(no_rope_layers=[1, 1, 1, 0]),
}
MODEL_TYPES = [f.model_types[0] for f in FAMILIES] + ["ministral", "olmo3"]


def tiny_config(model_type: str):
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **SIZES, **EXTRA.get(model_type, {}))
    config.use_cache = False
    return config
