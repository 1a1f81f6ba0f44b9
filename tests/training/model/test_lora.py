"""LoRA on the job's FSDP2 engine, on in-process gloo ranks (tests/training/inproc.py): two
sharded ranks against PEFT's own model trained by plain AdamW in one process, the frozen base
bitwise unchanged, adapter-only checkpoints that resume exactly with the base read from --model
again, the two exports loaded the ways users load them, and the GPU's dtype mix (bf16 base, fp32
adapters, bf16 compute) on CPU."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import torch
import torch.distributed as dist

from tests.training.inproc import run_ranks
# The base of every run here: a `tiny` Qwen2 saved by save_pretrained (tied embeddings).
from tests.training.run.test_export_loading import pretrained_dir  # noqa: F401
from training.config import TrainConfig
from training.model import lora
from training.model.model import model_config

STEPS, HALF, GLOBAL_BATCH, SEQ, RANK, ALPHA, LR = 6, 3, 4, 16, 4, 8.0, 1e-2
IDS = torch.tensor([list(range(3, 40, 3))])


def _cfg(model: str, **kw) -> TrainConfig:
    return TrainConfig(model=model, seq_len=SEQ, lr=LR, warmup_steps=0, grad_clip=0.0,
                       lora_rank=RANK, lora_alpha=ALPHA, num_workers=2, use_gpu=False, **kw)


def _batches() -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, 512, (STEPS, GLOBAL_BATCH, SEQ + 1), generator=g)


# --- on the gloo ranks ---------------------------------------------------------------------

def _full(engine, optim: bool = True) -> dict:
    """Copies of the full model (and optimizer) state on every rank (collective). Before the
    first step, leave the optimizer out: reading its state dict initializes its state with a
    zero-gradient step (torch's `_init_optim_state`), which shifts Adam's bias correction."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model = {k: v.detach().clone() for k, v in
             get_model_state_dict(engine.model, options=opts).items()}
    state = get_optimizer_state_dict(engine.model, engine.optimizer, options=opts).get("state", {}) \
        if optim else {}
    return {"model": model, "optim": {k: {n: t.clone() for n, t in v.items()}
                                      for k, v in state.items()}}


def _train(engine, steps) -> list[float]:
    from training.step.engine import mean_across_ranks, train_step

    rank, world = dist.get_rank(), dist.get_world_size()
    rows = GLOBAL_BATCH // world
    out = []
    for step in steps:
        mine = _batches()[step, rank * rows:(rank + 1) * rows]
        out.append(mean_across_ranks(train_step(engine, [(mine[:, :-1], mine[:, 1:])], LR, 0.0)))
    return out


def _logits(engine) -> torch.Tensor:
    engine.model.unshard()  # the root group; the layers gather themselves
    with torch.no_grad():
        out = engine.model.lm(input_ids=IDS).logits
    engine.model.reshard()
    return out


def _on_ranks(base: str, ckpt: str, out: str) -> dict:
    """Train, checkpoint, resume, export, reload the export, and the bf16 mix, on one gloo group
    (one spawn costs more than all of it)."""
    from training.run import checkpoint, export
    from training.run.run_files import RunFiles
    from training.step.engine import build_engine, plan_step
    from training.step.mesh import MeshLayout
    from training.step.parallelize import precision_policy

    cfg, cpu = _cfg(base), torch.device("cpu")
    engine = build_engine(cfg, model_config(base), cpu)
    r = {"initial": _full(engine, optim=False), "losses": _train(engine, range(1)),
         "trainable": sorted(n for n, p in engine.model.named_parameters() if p.requires_grad),
         "optimized": sum(len(g["params"]) for g in engine.optimizer.param_groups),
         "trainable_params": engine.trainable_params, "num_params": engine.num_params}
    r["after_one"] = _full(engine)
    r["losses"] += _train(engine, range(1, HALF))
    checkpoint.save_local(engine, checkpoint.RunState(step=HALF), ckpt)
    r["losses"] += _train(engine, range(HALF, STEPS))
    r["final"], r["logits"] = _full(engine), _logits(engine)
    resumed = build_engine(dataclasses.replace(cfg, seed=99), model_config(base), cpu)
    r["resumed_state"] = checkpoint.load_local(resumed, ckpt)
    r["resumed_losses"] = _train(resumed, range(HALF, STEPS))
    r["resumed_final"] = _full(resumed)
    other = build_engine(dataclasses.replace(cfg, lora_rank=RANK * 2), model_config(base), cpu)
    with pytest.raises(checkpoint.CheckpointError) as refused:
        checkpoint.load_local(other, ckpt)
    r["refused"] = str(refused.value)
    files = RunFiles(pafs.LocalFileSystem(), out) if dist.get_rank() == 0 else None
    r["export_path"] = export.export(engine, dataclasses.replace(cfg, export=True), files)
    dist.barrier()
    merged = f"{out}/{export.EXPORT_DIR}"  # a later run's --model
    again = build_engine(TrainConfig(model=merged, num_workers=2, use_gpu=False),
                         model_config(merged), cpu)
    r["merged_logits"] = _logits(again)
    mixed = build_engine(cfg, model_config(base), cpu, policy=precision_policy("fp32", None))
    before = _full(mixed, optim=False)
    r["mixed_losses"] = _train(mixed, [0] * 4)  # one batch again and again: the loss falls
    r["mixed_norm"] = float(mixed.grad_norm)
    r["mixed_before"], r["mixed_after"] = before, _full(mixed)
    r["mixed_dtypes"] = {n: p.dtype for n, p in mixed.model.named_parameters()}
    r["mixed_buffers"] = {n: b.clone() for n, b in mixed.model.named_buffers()}
    r["placement"], r["replicated"] = _placement(engine), engine.plan.replicate_base
    replicated = build_engine(cfg, model_config(base), cpu, spec=engine.lora,
                              plan=dataclasses.replace(engine.plan, replicate_base=True))
    r["replicated_placement"] = _placement(replicated)
    r["replicated_losses"] = _train(replicated, range(STEPS))
    r["one_gpu_plan"] = plan_step(cfg, model_config(base), (engine.num_params,
                                  engine.trainable_params), engine.lora,
                                  MeshLayout(((0,),), "one GPU"), None,
                                  on_gpu=False).replicate_base
    return r


def _placement(engine) -> dict[str, set[str]]:
    """The tensor types of the frozen and the trainable parameters (DTensor: FSDP2's shards)."""
    out: dict[str, set[str]] = {"frozen": set(), "trainable": set()}
    for p in engine.model.parameters():
        out["trainable" if p.requires_grad else "frozen"].add(type(p.data).__name__)
    return out


@pytest.fixture(scope="module")
def ranks(pretrained_dir, tmp_path_factory):
    ckpt, out = tmp_path_factory.mktemp("ckpt"), tmp_path_factory.mktemp("export")
    return run_ranks(2, _on_ranks, str(pretrained_dir), str(ckpt), str(out))[0], ckpt, out


# --- the one-process reference: PEFT's model, plain AdamW ------------------------------------

def _peft_name(ours: str) -> str:
    """`lm.model.layers.0...lora_A.default.weight` as PeftModel names it."""
    return lora.PEFT_PREFIX + ours.removeprefix("lm.")


@pytest.fixture(scope="module")
def reference(pretrained_dir, ranks):
    """PeftModel over the same base and initial adapters, the same global batches, one process,
    no FSDP: AdamW as the job's (betas 0.9/0.95, decay 0.1 on matrices)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    initial = ranks[0]["initial"]["model"]
    spec = lora.LoraSpec.from_config(_cfg(str(pretrained_dir)))
    base = AutoModelForCausalLM.from_pretrained(pretrained_dir, dtype=torch.float32)
    model = get_peft_model(base, spec.peft_config())
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in initial.items():
            if lora.is_adapter(name):
                params[_peft_name(name)].copy_(value)
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    losses, first_grads = [], None
    for batch in _batches():
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        first_grads = first_grads or {n: p.grad.clone() for n, p in model.named_parameters()
                                      if p.grad is not None}
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return {"losses": losses, "grads": first_grads, "model": model,
            "adapters": {n: p.detach().clone() for n, p in model.named_parameters()
                         if p.requires_grad}}


def test_only_the_adapters_train_and_the_base_stays_bitwise_what_from_pretrained_loaded(
        ranks, pretrained_dir):
    from transformers import AutoModelForCausalLM

    r = ranks[0]
    assert r["trainable"] and all(lora.is_adapter(n) for n in r["trainable"])
    # 2 layers x 7 projections x (A, B), and the optimizer holds exactly those
    assert len(r["trainable"]) == 28 and r["optimized"] == 28
    assert set(r["final"]["optim"]) == set(r["trainable"])
    assert r["trainable_params"] == sum(v.numel() for k, v in r["final"]["model"].items()
                                        if lora.is_adapter(k)) < r["num_params"] / 10
    pretrained = AutoModelForCausalLM.from_pretrained(pretrained_dir,
                                                      dtype=torch.float32).state_dict()
    frozen = {k: v for k, v in r["final"]["model"].items() if not lora.is_adapter(k)}
    assert len(frozen) == len(pretrained)
    for key, value in frozen.items():
        assert torch.equal(value, pretrained[key.removeprefix("lm.").replace(".base_layer", "")])
    changed = [k for k in r["trainable"]
               if not torch.equal(r["initial"]["model"][k], r["final"]["model"][k])]
    assert changed == r["trainable"]


def test_the_frozen_base_is_replicated_outside_fsdp_and_trains_as_the_sharded_one(ranks):
    """The planner replicates the frozen base (fully_shard's ignored_params) on a one-GPU shard
    group only; over two ranks it stays sharded. Replicated: whole plain tensors on each rank,
    only the adapters sharded, the same losses as the sharded base's from the same start."""
    r = ranks[0]
    assert r["one_gpu_plan"] and not r["replicated"]
    assert r["placement"] == {"frozen": {"DTensor"}, "trainable": {"DTensor"}}
    assert r["replicated_placement"] == {"frozen": {"Tensor"}, "trainable": {"DTensor"}}
    assert torch.allclose(torch.tensor(r["replicated_losses"]), torch.tensor(r["losses"]),
                          rtol=1e-5)


def test_two_sharded_ranks_equal_peft_in_one_process_in_gradients_losses_and_adapters(
        ranks, reference):
    r = ranks[0]
    # After step 1, Adam's first moment is 0.1 x the (unclipped) gradient, shard by shard.
    for name in r["trainable"]:
        ours = r["after_one"]["optim"][name]["exp_avg"] / 0.1
        theirs = reference["grads"][_peft_name(name)]
        assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-7), name
    assert any(float(v.abs().max()) > 0 for v in reference["grads"].values())
    assert torch.allclose(torch.tensor(r["losses"]), torch.tensor(reference["losses"]), rtol=1e-5)
    for name in r["trainable"]:
        assert torch.allclose(r["final"]["model"][name],
                              reference["adapters"][_peft_name(name)], rtol=1e-4, atol=1e-6), name


def test_an_adapter_checkpoint_holds_only_adapters_and_resumes_exactly(ranks):
    import torch.distributed.checkpoint as dcp

    r, ckpt, _ = ranks
    meta = dcp.FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    assert {k.removeprefix("model.") for k in meta if k.startswith("model.")} == \
        set(r["trainable"])
    # The adapters and their two Adam moments (and Adam's step counts), nothing of the base.
    stored = sum(math.prod(m.size) for m in meta.values() if hasattr(m, "size"))
    assert stored == 3 * r["trainable_params"] + len(r["trainable"])
    # A full fine-tune's checkpoint holds 12 bytes a parameter; DCP adds some per tensor.
    written = sum(p.stat().st_size for p in Path(ckpt).iterdir())
    assert written < 12 * r["num_params"] / 3, written
    assert r["resumed_state"].step == HALF
    assert r["resumed_losses"] == r["losses"][HALF:]  # to the bit
    for name in r["trainable"]:
        assert torch.equal(r["resumed_final"]["model"][name], r["final"]["model"][name])
        for moment in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(r["resumed_final"]["optim"][name][moment],
                               r["final"]["optim"][name][moment])
    assert "fine-tunes LoRA adapters" in r["refused"] and "--lora-" in r["refused"]


def test_merged_export_is_base_plus_scaled_ba_and_loads_with_transformers_and_as_model(ranks):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from training.run import export

    r, _, out = ranks
    path = out / export.EXPORT_DIR
    assert r["export_path"] == str(path) and (path / export.MARKER).exists()
    final, weights = r["final"]["model"], load_file(path / "model.safetensors")
    q = "model.layers.1.self_attn.q_proj"
    a, b = (final[f"lm.{q}.lora_{x}.default.weight"] for x in "AB")
    expected = final[f"lm.{q}.base_layer.weight"] + (ALPHA / RANK) * b @ a
    assert torch.equal(weights[f"{q}.weight"], expected.to(torch.bfloat16))
    assert not any("lora" in k or "base_layer" in k for k in weights)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.bfloat16
    with torch.no_grad():
        logits = model.float()(input_ids=IDS).logits
    assert torch.allclose(logits, r["logits"], atol=0.05), (logits - r["logits"]).abs().max()
    # --model of a later run: the export, read by rank 0 and sharded, gives its logits exactly
    exact = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(r["merged_logits"], exact(input_ids=IDS).logits)


def test_adapter_export_loads_with_peft_on_the_base_and_gives_the_trained_logits(
        ranks, pretrained_dir):
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from training.run import export

    r, _, out = ranks
    path = out / export.ADAPTER_DIR
    assert (path / export.MARKER).exists()
    config = json.loads((path / lora.ADAPTER_CONFIG).read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (RANK, ALPHA, "LORA")
    assert config["base_model_name_or_path"] == str(pretrained_dir)
    base = AutoModelForCausalLM.from_pretrained(pretrained_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, path)
    with torch.no_grad():
        logits = model(input_ids=IDS).logits
    assert torch.allclose(logits, r["logits"], atol=1e-5), (logits - r["logits"]).abs().max()


def test_bf16_base_with_fp32_adapters_under_bf16_compute_trains_and_leaves_the_base(ranks):
    r = ranks[0]
    dtypes = r["mixed_dtypes"]
    assert {d for n, d in dtypes.items() if lora.is_adapter(n)} == {torch.float32}
    assert {d for n, d in dtypes.items() if not lora.is_adapter(n)} == {torch.bfloat16}
    assert all(torch.isfinite(torch.tensor(x)) for x in r["mixed_losses"] + [r["mixed_norm"]])
    assert abs(r["mixed_losses"][0] - r["losses"][0]) < 0.02  # bf16 compute, same start
    assert r["mixed_losses"][-1] < r["mixed_losses"][0] - 0.01
    for name, value in r["mixed_before"]["model"].items():
        if not lora.is_adapter(name):
            assert torch.equal(value, r["mixed_after"]["model"][name]), name


def test_a_quantized_model_directory_is_refused_as_qlora_naming_why(tmp_path):
    import json

    from training.model.model import ModelError

    config = model_config("tiny").to_dict()
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="quantized model.*QLoRA .* not supported"):
        model_config(str(tmp_path))


def test_a_bf16_lora_base_keeps_the_fp32_rotary_buffers_from_pretrained_gives_it(
        ranks, pretrained_dir):
    """The GPU's LoRA path (bf16 base) rotates with the frequencies inference uses: the buffers
    of `from_pretrained(dtype=torch.bfloat16)`, fp32, bitwise (not a bf16-rounded RoPE)."""
    from transformers import AutoModelForCausalLM

    ours = ranks[0]["mixed_buffers"]
    theirs = dict(AutoModelForCausalLM.from_pretrained(pretrained_dir,
                                                       dtype=torch.bfloat16).named_buffers())
    assert any("inv_freq" in n for n in theirs) and theirs[next(iter(theirs))].dtype == torch.float32
    assert {n.removeprefix("lm."): b.dtype for n, b in ours.items()} == \
        {n: b.dtype for n, b in theirs.items()}
    for name, value in theirs.items():
        assert torch.equal(ours[f"lm.{name}"], value), name
