"""The supported-models table (training/model/families.py) held against each family's real
architecture on a tiny random config: packed documents stay apart in every layer type, LoRA
adapts every attention and MLP projection, and what is outside the table is refused on the
driver before Ray, naming it and the list."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from tests.training.model.tiny_families import MODEL_TYPES, tiny_config
from training.config import TrainConfig
from training.model.families import BY_MODEL_TYPE, ArchitectureError, check


def _hidden(model, ids: list[int], positions: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model.hidden(torch.tensor([ids]), torch.tensor([positions]))[0]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_a_packed_documents_hidden_states_are_its_own_in_every_layer_type(model_type):
    """Document B after document A in one row (positions restarting, no mask: how the job
    packs) gives B the hidden states it has alone, through sliding-window layers (a window of 6
    inside 12-token documents) and full ones; Qwen3.5's linear-attention layers carry their
    state across the boundary, which is why its row says no packing (and it is refused)."""
    from transformers import AutoModelForCausalLM

    from training.model.model import CausalLMWithLoss

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(tiny_config(model_type), attn_implementation="sdpa")
    model = CausalLMWithLoss(lm.eval(), loss_chunk_tokens=0)
    a, b = list(range(3, 13)), list(range(40, 52))
    alone = _hidden(model, b, list(range(len(b))))
    packed = _hidden(model, a + b, list(range(len(a))) + list(range(len(b))))[len(a):]
    apart = torch.allclose(alone, packed, atol=1e-5)
    assert apart == BY_MODEL_TYPE[model_type].packing, (model_type, (alone - packed).abs().max())


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_lora_adapts_every_attention_and_mlp_projection_of_each_layer(model_type):
    """The family's default targets (what --lora-target-modules left at its default becomes)
    put adapters on each decoder layer's attention (or linear-attention) and MLP projections:
    every linear layer but the LM head and Qwen3.5's per-head gates."""
    from transformers import AutoModelForCausalLM

    from training.model.lora import LoraSpec, apply, with_family_targets

    config = tiny_config(model_type)
    cfg = with_family_targets(TrainConfig(model="x", lora_rank=4), config)
    lm = AutoModelForCausalLM.from_config(config)
    linears = [{n for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
               for layer in lm.model.layers]
    apply(lm, LoraSpec.from_config(cfg), torch.float32)
    for i, (layer, linear) in enumerate(zip(lm.model.layers, linears)):
        adapted = {n for n, m in layer.named_modules() if hasattr(m, "lora_A")}
        expected = {n for n in linear if not n.endswith(("in_proj_a", "in_proj_b"))}
        assert adapted == expected and any("mlp" in n for n in adapted), (i, linear - adapted)
        assert any("attn" in n for n in adapted), i


def _outside_configs():
    from transformers import AutoConfig, Gemma3Config, Qwen3_5Config

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=300)
    return {
        "multimodal": (Qwen3_5Config(), "Qwen3_5ForConditionalGeneration"),
        "multimodal gemma": (Gemma3Config(), "Gemma3ForConditionalGeneration"),
        "mixture-of-experts": (AutoConfig.for_model("qwen3_moe", **small), "Qwen3MoeForCausalLM"),
        "not been tested": (AutoConfig.for_model("gpt2"), "GPT2LMHeadModel"),
        "linear-attention": (tiny_config("qwen3_5_text"), "Qwen3_5ForCausalLM"),
    }


@pytest.mark.parametrize("why", ["multimodal", "multimodal gemma", "mixture-of-experts",
                                 "not been tested", "linear-attention"])
def test_outside_the_table_is_refused_naming_it_and_the_list_unless_allowed(why):
    config, arch = _outside_configs()[why]
    config.architectures = [arch]
    with pytest.raises(ArchitectureError) as e:
        check(config)
    assert arch in str(e.value) and why.split()[0] in str(e.value)
    assert "Supported: Qwen2 / Qwen2.5 (Qwen2ForCausalLM)" in str(e.value)
    _, limits = check(config, allow_untested=True)
    assert limits.startswith("untested architecture") and arch in limits


def test_soft_capped_logits_are_refused_even_when_untested_architectures_are_allowed():
    from transformers import AutoConfig

    config = AutoConfig.for_model("gemma2", final_logit_softcapping=30.0)
    with pytest.raises(ArchitectureError, match="final_logit_softcapping"):
        check(config, allow_untested=True)


def _model_dir(tmp_path, model_type: str, arch: str, **sizes):
    from transformers import AutoConfig

    model = tmp_path / model_type
    config = AutoConfig.for_model(model_type, **sizes)
    config.architectures = [arch]
    config.save_pretrained(model)
    (model / "model.safetensors").write_bytes(b"")  # the directory check only lists names
    return model


def test_the_driver_refuses_a_mixture_of_experts_model_in_one_line_before_ray(tmp_path):
    model = _model_dir(tmp_path, "qwen3_moe", "Qwen3MoeForCausalLM", num_hidden_layers=2,
                       hidden_size=64)
    proc = subprocess.run([sys.executable, "-m", "training", "--local", "--storage-path",
                           str(tmp_path / "runs"), "--model", str(model), "--data", "random"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stderr[-2000:]
    assert "Qwen3MoeForCausalLM" in proc.stderr and "mixture-of-experts" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_an_allowed_untested_architecture_says_so_in_the_runs_log(tmp_path, capsys):
    from training.driver.checks import check_model

    cfg = TrainConfig(model=str(_model_dir(tmp_path, "gpt2", "GPT2LMHeadModel")))
    with pytest.raises(ArchitectureError, match="GPT2LMHeadModel"):
        check_model(cfg, None)
    check_model(dataclasses.replace(cfg, allow_untested_architecture=True), None)
    assert "warning: untested architecture: --model GPT2LMHeadModel" in capsys.readouterr().out
