"""Each family's tiny random config trained by the job's engine on two FSDP2 ranks (gloo, as on
the cluster but on CPU) gives the losses and weights of the same model in one process, full
fine-tuning and LoRA; the two-rank run's exports (full, merged, PEFT adapter) load back to its
logits and its full fine-tuning checkpoint of step 1 resumes to the bit. One launch of each world size for
every family (a spawned rank re-imports torch and transformers, seconds apiece)."""

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


def _train(engine, cfg: TrainConfig, batch: torch.Tensor, steps: int) -> list[float]:
    """`steps` optimizer steps on this rank's rows of `batch`; the mean loss of each."""
    from training.step.engine import mean_across_ranks, train_step

    rows = BATCH // dist.get_world_size()
    mine = batch[dist.get_rank() * rows:][:rows]
    return [mean_across_ranks(train_step(engine, [(mine[:, :-1], mine[:, 1:])], cfg.lr,
                                         cfg.grad_clip)) for _ in range(steps)]


def _weights(engine, lora: bool) -> dict:
    """What trains: every weight, or the adapters."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(engine.model, options=StateDictOptions(full_state_dict=True,
                                                                        cpu_offload=True))
    return {k: v for k, v in state.items() if not lora or "lora_" in k}


def _resumed(cfg: TrainConfig, config, batch: torch.Tensor, ckpt: str) -> dict:
    """A new engine of another seed (only the checkpoint can give it the weights) loaded from
    the full fine-tuning checkpoint of step 1, trained to step STEPS."""
    from training.run import checkpoint
    from training.step.engine import build_engine

    engine = build_engine(dataclasses.replace(cfg, seed=cfg.seed + 1), config,
                          torch.device("cpu"))
    step = checkpoint.load_local(engine, ckpt).step
    return {"step": step, "losses": _train(engine, cfg, batch, STEPS - step),
            "weights": _weights(engine, False)}


def _losses_and_weights(model_type: str, lora: bool, out: str | None = None) -> dict:
    """Train STEPS steps on one batch; with `out` (the two-rank run) also export, and (full
    fine-tuning) save a checkpoint after step 1 that a new engine resumes from. LoRA's
    adapter-only checkpoints resume on Qwen2 (tests/training/model/test_lora.py): the same
    path for every family's adapters, at twice full fine-tuning's cost here (about 5 s)."""
    from training.model.lora import with_family_targets
    from training.run import checkpoint
    from training.step.engine import build_engine

    config = tiny_config(model_type)
    cfg = with_family_targets(dataclasses.replace(CFG, lora_rank=4 if lora else 0), config)
    engine = build_engine(cfg, config, torch.device("cpu"))
    g = torch.Generator().manual_seed(7)
    batch = torch.randint(3, config.vocab_size, (BATCH, SEQ + 1), generator=g)  # fit it
    losses = _train(engine, cfg, batch, 1)
    where = out and f"{out}/{model_type}-{int(lora)}"
    resume = where and not lora and f"{where}-step1"
    if resume:
        checkpoint.save_local(engine, checkpoint.RunState(step=1), resume)
    losses += _train(engine, cfg, batch, STEPS - 1)
    return {"losses": losses, "weights": _weights(engine, lora), "logits": _logits(engine),
            "export": _export(engine, cfg, where),
            "resumed": resume and _resumed(cfg, config, batch, resume)}


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


@pytest.mark.parametrize("model_type", FAMILIES)
def test_each_familys_adapter_loads_with_peft_onto_its_base_to_the_trained_logits(both,
                                                                                  model_type):
    """The two-rank LoRA run's `hf_adapter/` (fp32, PEFT's format) put by PEFT onto the base it
    names (a built-in shape's: the run's `hf_base/`, its random init) is the trained model."""
    import json
    from pathlib import Path

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from training.model import lora
    from training.run import export

    run = both[1][(model_type, True)]
    adapter = Path(run["export"]).parent / export.ADAPTER_DIR
    base = json.loads((adapter / lora.ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
    lm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()
    assert lm.get_base_model().config.model_type == model_type
    with torch.no_grad():
        logits = lm(input_ids=IDS).logits
    assert torch.allclose(logits, run["logits"], atol=1e-4), (logits - run["logits"]).abs().max()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_each_family_resumes_exactly_from_a_checkpoint(both, model_type):
    """On two ranks, a new engine loaded from the full fine-tuning checkpoint of step 1 trains
    steps 2 and 3 to the bit of the run that went on: every weight of the architecture (tied
    embeddings, QK norms, fused projections) and its Adam state went through the checkpoint."""
    run = both[1][(model_type, False)]
    resumed = run["resumed"]
    assert resumed["step"] == 1 and resumed["losses"] == run["losses"][1:]
    assert resumed["weights"].keys() == run["weights"].keys()
    assert all(torch.equal(resumed["weights"][k], v) for k, v in run["weights"].items())
