"""Each family's tiny random config trained by the job's engine on two FSDP2 ranks (gloo, as on
the cluster but on CPU) gives the losses and weights of the same model in one process, full
fine-tuning and LoRA: one launch of each world size for every family (a spawned rank re-imports
torch and transformers, seconds apiece)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from tests.training.inproc import run_ranks
from tests.training.model.tiny_families import tiny_config
from training.config import TrainConfig

FAMILIES = ["llama", "mistral", "qwen3", "gemma3_text", "phi3", "olmo3", "smollm3"]
STEPS, BATCH, SEQ = 3, 4, 16
# The engine builds a built-in shape's random init; `tiny` with another family's config is
# that family's architecture at this size.
CFG = TrainConfig(model="tiny", seq_len=SEQ, lr=1e-2, warmup_steps=0, grad_clip=0.05, seed=0)


def _losses_and_weights(model_type: str, lora: bool) -> tuple[list[float], dict]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from training.model.lora import with_family_targets
    from training.step.engine import build_engine, mean_across_ranks, train_step

    config = tiny_config(model_type)
    cfg = with_family_targets(dataclasses.replace(CFG, lora_rank=4 if lora else 0), config)
    engine = build_engine(cfg, config, torch.device("cpu"))
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = BATCH // world
    g = torch.Generator().manual_seed(7)
    batch = torch.randint(3, config.vocab_size, (BATCH, SEQ + 1), generator=g)  # fit it
    losses = []
    for _ in range(STEPS):
        mine = batch[rank * rows:(rank + 1) * rows]
        losses.append(mean_across_ranks(train_step(engine, [(mine[:, :-1], mine[:, 1:])],
                                                   cfg.lr, cfg.grad_clip)))
    state = get_model_state_dict(engine.model, options=StateDictOptions(full_state_dict=True,
                                                                        cpu_offload=True))
    return losses, {k: v for k, v in state.items() if not lora or "lora_" in k}


def _every_family() -> dict:
    return {(t, lora): _losses_and_weights(t, lora) for t in FAMILIES for lora in (False, True)}


@pytest.fixture(scope="module")
def both():
    return run_ranks(1, _every_family)[0], run_ranks(2, _every_family)[0]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_two_fsdp2_ranks_train_each_family_as_one_process(both, model_type, lora):
    (one_losses, one), (two_losses, two) = (r[(model_type, lora)] for r in both)
    assert one_losses[-1] < one_losses[0]  # it learns: a loss that is equal and flat proves less
    assert torch.allclose(torch.tensor(one_losses), torch.tensor(two_losses), rtol=1e-5)
    assert one.keys() == two.keys() and one
    bad = [(k, float((one[k] - two[k]).abs().max()), float(one[k].abs().max())) for k in one
           if not torch.allclose(one[k], two[k], rtol=1e-3, atol=5e-5)]
    assert not bad, bad
