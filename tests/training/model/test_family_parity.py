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
from tests.training.model.test_lora import IDS, _logits  # the trained model's logits on IDS
from tests.training.model.tiny_families import tiny_config
from training.config import TrainConfig

FAMILIES = ["llama", "mistral", "qwen3", "gemma3_text", "phi3", "olmo3", "smollm3"]
STEPS, BATCH, SEQ = 3, 4, 16
# The engine builds a built-in shape's random init; `tiny` with another family's config is
# that family's architecture at this size.
CFG = TrainConfig(model="tiny", seq_len=SEQ, lr=1e-2, warmup_steps=0, grad_clip=0.05, seed=0)


def _export(engine, cfg: TrainConfig, out: str | None) -> str | None:
    """The job's export of the trained model (LoRA: merged), fp32, and its logits on IDS."""
    import pyarrow.fs as pafs

    from training.run import export
    from training.run.run_files import RunFiles

    files = RunFiles(pafs.LocalFileSystem(), out) if out and dist.get_rank() == 0 else None
    path = export.export(engine, dataclasses.replace(cfg, export=True, export_dtype="fp32"),
                         files)
    dist.barrier()
    return path


def _losses_and_weights(model_type: str, lora: bool, out: str | None = None) -> dict:
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
    weights = {k: v for k, v in state.items() if not lora or "lora_" in k}
    return {"losses": losses, "weights": weights, "logits": _logits(engine),
            "export": _export(engine, cfg, out and f"{out}/{model_type}-{int(lora)}")}


def _every_family(out: str | None) -> dict:
    return {(t, lora): _losses_and_weights(t, lora, out) for t in FAMILIES
            for lora in (False, True)}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("exports"))
    return run_ranks(1, _every_family, None)[0], run_ranks(2, _every_family, out)[0]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_two_fsdp2_ranks_train_each_family_as_one_process(both, model_type, lora):
    one_run, two_run = (r[(model_type, lora)] for r in both)
    one_losses, one = one_run["losses"], one_run["weights"]
    two_losses, two = two_run["losses"], two_run["weights"]
    assert one_losses[-1] < one_losses[0]  # it learns: a loss that is equal and flat proves less
    assert torch.allclose(torch.tensor(one_losses), torch.tensor(two_losses), rtol=1e-5)
    assert one.keys() == two.keys() and one
    bad = [(k, float((one[k] - two[k]).abs().max()), float(one[k].abs().max())) for k in one
           if not torch.allclose(one[k], two[k], rtol=1e-3, atol=5e-5)]
    assert not bad, bad


@pytest.mark.parametrize("lora", [False, True], ids=["full", "merged"])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_each_familys_export_loads_with_from_pretrained_to_the_trained_logits(both, model_type,
                                                                              lora):
    """The two-rank run's export (fp32; LoRA merged into the base) read back by transformers
    is the model that was trained: the same class and logits."""
    from transformers import AutoModelForCausalLM

    run = both[1][(model_type, lora)]
    lm = AutoModelForCausalLM.from_pretrained(run["export"]).eval()
    assert lm.config.model_type == model_type
    with torch.no_grad():
        logits = lm(input_ids=IDS).logits
    assert torch.allclose(logits, run["logits"], atol=1e-4), (logits - run["logits"]).abs().max()
