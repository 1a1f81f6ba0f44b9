"""What a run leaves behind and how the next one starts from it, on 2 in-process gloo ranks (no
Ray): pretrained weights read by rank 0 only and sharded exactly (also under fp32 accumulation
with a bf16 reduce), the exported Hugging Face directory reloaded by transformers and, for a chat
run, generating until the end of the turn; its COMPLETE marker, model directories checked up
front."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import torch

from tests.training.inproc import run_ranks
from training.model import loading
from training.run import export
from training.model.model import ModelError, model_config
from training.run.run_files import RunFiles

IDS = torch.tensor([list(b"Hello, world. Hello again.")])


@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory):
    """A `tiny` Qwen2 (tied embeddings) saved by save_pretrained, as a hub snapshot would be."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    out = tmp_path_factory.mktemp("pretrained")
    AutoModelForCausalLM.from_config(model_config("tiny")).save_pretrained(out)
    return out


def _load_on_rank(model_dir: str) -> dict:
    """Build the engine from `model_dir` on this rank; count the safetensors files it opens
    (transformers' loader opens them through `safe_open`, which it imports by name)."""
    import transformers.modeling_utils as mu
    from torch.distributed.tensor import DTensor

    from training.config import TrainConfig
    from training.step.engine import build_engine

    opened: list[str] = []
    real = mu.safe_open

    def counting(path, *args, **kwargs):
        opened.append(str(path))
        return real(path, *args, **kwargs)

    mu.safe_open = counting
    cfg = TrainConfig(model=model_dir, num_workers=2, use_gpu=False)
    engine = build_engine(cfg, model_config(model_dir), torch.device("cpu"))
    lm = engine.model.lm
    state = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
             for k, v in engine.model.state_dict().items()}  # collective, same order everywhere
    engine.model.unshard()  # the root group (embeddings, tied head); layers gather themselves
    with torch.no_grad():
        logits = lm(input_ids=IDS).logits
    engine.model.reshard()
    return {"opened": opened, "state": state, "logits": logits, "load": engine.load,
            "tied": lm.lm_head.weight is lm.model.embed_tokens.weight,
            "inv_freq": lm.model.rotary_emb.inv_freq.clone()}


def _on_rank(model_dir: str, export_root: str, chat_model: str, tokenizer: str) -> dict:
    """Every part on one gloo group (one spawn costs more than any part)."""
    return {"load": _load_on_rank(model_dir), "export": _train_and_export(export_root),
            "accum": _pretrained_fp32_accumulation(model_dir),
            "chat": _chat_run_export(chat_model, tokenizer, export_root)}


@pytest.fixture(scope="module")
def chat_source(tmp_path_factory, qwen_base_tokenizer):
    """A pretrained `tiny` for the Qwen-like base tokenizer, whose generation config stops at
    the tokenizer's EOS only (`<|endoftext|>`), as Qwen/Qwen2.5-1.5B's does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(qwen_base_tokenizer)
    torch.manual_seed(2)
    out = tmp_path_factory.mktemp("chat-source")
    AutoModelForCausalLM.from_config(model_config("tiny", len(tok))).save_pretrained(out)
    GenerationConfig(eos_token_id=tok.eos_token_id, bos_token_id=None,
                     use_cache=False).save_pretrained(out)  # as a model saved for training
    return out


@pytest.fixture(scope="module")
def ranks(pretrained_dir, tmp_path_factory, chat_source, qwen_base_tokenizer):
    root = tmp_path_factory.mktemp("exports")
    return root, run_ranks(2, _on_rank, str(pretrained_dir), str(root), str(chat_source),
                           str(qwen_base_tokenizer))


def test_pretrained_weights_are_read_by_rank0_only_and_shard_to_exactly_from_pretrained(
        pretrained_dir, ranks):
    from transformers import AutoModelForCausalLM

    ranks = [r["load"] for r in ranks[1]]
    ref = AutoModelForCausalLM.from_pretrained(pretrained_dir, dtype=torch.float32)
    expected = ref.state_dict()
    assert [len(r["opened"]) > 0 for r in ranks] == [True, False], [r["opened"] for r in ranks]
    with torch.no_grad():
        ref_logits = ref(input_ids=IDS).logits
    for r in ranks:
        assert r["state"].keys() == {f"lm.{k}" for k in expected}
        assert all(torch.equal(v, expected[k.removeprefix("lm.")]) for k, v in r["state"].items())
        assert r["tied"]  # one parameter, still: training updates both uses together
        assert torch.equal(r["inv_freq"], ref.model.rotary_emb.inv_freq)  # in no state dict
        assert torch.equal(r["logits"], ref_logits)
        assert len(r["load"].load_host_rss_gib) == 2 and r["load"].load_s > 0


def _train_and_export(root: str) -> dict:
    """One optimizer step on `tiny` (byte vocabulary), then an export in each dtype (into
    `root/<dtype>`); returns the trained model's logits and the exports' paths (rank 0)."""
    import dataclasses

    from training.config import TrainConfig
    from training.data.random_tokens import random_batch
    from training.data.tokenize import BYTES, BYTES_VOCAB
    from training.step.engine import build_engine, train_step

    cfg = TrainConfig(model="tiny", tokenizer=BYTES, num_workers=2, use_gpu=False, export=True)
    engine = build_engine(cfg, model_config("tiny", BYTES_VOCAB), torch.device("cpu"))
    rank = torch.distributed.get_rank()
    batch = random_batch(seed=0, rank=rank, step=1, micro=0, batch=2, seq_len=16,
                         vocab=BYTES_VOCAB, repeat=False)
    train_step(engine, [batch], lr=1e-2, grad_clip=1.0)
    engine.model.unshard()
    with torch.no_grad():
        logits = engine.model.lm(input_ids=IDS).logits
    engine.model.reshard()
    paths = {}
    for dtype in export.DTYPES:
        files = RunFiles(pafs.LocalFileSystem(), f"{root}/{dtype}") if rank == 0 else None
        paths[dtype] = export.export(engine, dataclasses.replace(cfg, export_dtype=dtype), files)
    return {"paths": paths, "logits": logits, "num_params": engine.num_params}


@pytest.mark.parametrize("dtype, bytes_per_param, atol", [("bf16", 2, 0.05), ("fp32", 4, 0.0)])
def test_export_reloads_with_transformers_and_gives_the_trained_models_logits(
        ranks, dtype, bytes_per_param, atol):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root, first = ranks[0], ranks[1][0]["export"]
    path = root / dtype / export.EXPORT_DIR
    assert first["paths"][dtype] == str(path) and (path / export.MARKER).exists()
    model = AutoModelForCausalLM.from_pretrained(path)  # the dtype config.json names
    assert model.dtype == export.DTYPES[dtype]
    with torch.no_grad():
        logits = model.float()(input_ids=IDS).logits
    assert torch.allclose(logits, first["logits"], atol=atol, rtol=0), \
        (logits - first["logits"]).abs().max()
    with safe_open(path / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys  # tied: once
    weights = (path / "model.safetensors").stat().st_size
    assert first["num_params"] * bytes_per_param < weights < first["num_params"] * \
        bytes_per_param * 1.05
    tok = AutoTokenizer.from_pretrained(path)
    text = "Grüße, world"
    assert tok.encode(text, add_special_tokens=False) == list(text.encode())  # the byte ids
    prompt = tok(text, return_tensors="pt").input_ids
    out = model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape[1] == prompt.shape[1] + 4
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == 256


def test_a_torn_export_has_no_marker(tmp_path, monkeypatch):
    files = RunFiles(pafs.LocalFileSystem(), str(tmp_path))
    good = tmp_path / "good"
    good.mkdir()
    (good / "config.json").write_text("{}")
    files.publish(str(good), "hf_model", "COMPLETE")
    assert files.has("hf_model/COMPLETE")

    def dies_midway(*_args, **_kwargs):
        raise OSError("connection reset while uploading")

    monkeypatch.setattr(pafs, "copy_files", dies_midway)
    with pytest.raises(OSError):
        files.publish(str(good), "hf_model", "COMPLETE")
    assert not files.has("hf_model/COMPLETE")  # the old export's marker went first


def test_a_model_directory_without_weights_is_refused_naming_what_it_holds(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(model_config("tiny").to_dict()))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelError, match=r"no model.safetensors.*holds: config.json, "
                                         r"tokenizer.json"):
        model_config(str(tmp_path))
    (tmp_path / loading.WEIGHTS_INDEX).write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(ModelError, match="names shards that are not there"):
        model_config(str(tmp_path))


def test_an_s3_model_directory_is_checked_and_its_small_files_read_with_the_run_credentials(
        s3_server, pretrained_dir):
    with pytest.raises(ModelError, match="no config.json.*holds: nothing"):
        model_config("s3://ckpt/nothing-here/")
    for f in pretrained_dir.iterdir():
        s3_server.put_object(Bucket="ckpt", Key=f"models/tiny/{f.name}", Body=f.read_bytes())
    config = model_config("s3://ckpt/models/tiny/")
    assert config.hidden_size == model_config("tiny").hidden_size
    local = loading.local_dir("s3://ckpt/models/tiny/")
    assert sorted(p.name for p in Path(local).iterdir()) == \
        ["config.json", "generation_config.json"]  # no weights: rank 0 alone downloads those


def _pretrained_fp32_accumulation(model_dir: str) -> dict:
    """--accum-dtype fp32 --reduce-dtype bf16 on a pretrained directory, as build_engine orders
    it (meta model, shard, then load), with the GPU's bf16-parameter policy on gloo."""
    import time

    import torch.distributed as dist

    from training.model.model import CausalLMWithLoss, build_model
    from training.step.parallelize import precision_policy, shard_model

    config = model_config(model_dir)
    model = CausalLMWithLoss(build_model(model_dir, config, seed=0), 64)  # on meta
    shard_model(model, torch.device("cpu"), reshard_after_forward=True,
                activation_checkpointing=False, reduce_dtype="bf16", accum_dtype="fp32",
                policy=precision_policy("bf16", "fp32"))
    loading.load_sharded(model, loading.rank0_state(model_dir, config, dist.get_rank()),
                         torch.device("cpu"), time.perf_counter())
    g = torch.Generator().manual_seed(dist.get_rank())
    for i in range(4):
        tokens = torch.randint(0, config.vocab_size, (2, 17), generator=g)
        model.set_requires_gradient_sync(i == 3)
        model(tokens[:, :-1], tokens[:, 1:]).backward()
    grads = [p.grad.to_local() for p in model.parameters()]
    return {"bf16_wire": all(torch.equal(g, g.bfloat16().float()) for g in grads),
            "fp32_accumulated": all(g.dtype == torch.float32 for g in grads)}


def test_fp32_accumulation_with_a_bf16_reduce_loads_a_pretrained_model(ranks):
    """The root's lazy init used to run at sharding time, on the meta parameters a pretrained
    model has until it is loaded: torch refused them (_validate_no_meta_params)."""
    for r in ranks[1]:
        assert r["accum"] == {"bf16_wire": True, "fp32_accumulated": True}


CHAT = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "four"}]


def _chat_run_export(model_dir: str, tokenizer: str, root: str) -> str | None:
    """A chat run from a pretrained source: the one conversation learned by heart, exported."""
    import dataclasses

    from training.config import TrainConfig
    from training.data.packing import Batch
    from training.data.tokenize import HFEncoder
    from training.model.loss import IGNORE_INDEX
    from training.step.engine import build_engine, train_step

    cfg = TrainConfig(model=model_dir, tokenizer=tokenizer, num_workers=2, use_gpu=False,
                      export=True, lr=1e-2)
    engine = build_engine(cfg, model_config(model_dir), torch.device("cpu"))
    ids, trained = HFEncoder(tokenizer).chat(CHAT)
    labels = [t if keep else IGNORE_INDEX for t, keep in zip(ids[1:], trained[1:])]
    batch = Batch(torch.tensor([ids[:-1]] * 2), torch.tensor([labels] * 2))
    for _ in range(60):
        train_step(engine, [batch], lr=cfg.lr, grad_clip=1.0)
    rank = torch.distributed.get_rank()
    files = RunFiles(pafs.LocalFileSystem(), f"{root}/chat") if rank == 0 else None
    return export.export(engine, dataclasses.replace(cfg, export_dtype="fp32"), files)


def test_a_chat_runs_export_generates_until_the_end_of_the_turn_and_stops(ranks):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ranks[1][0]["chat"]
    tok = AutoTokenizer.from_pretrained(path)
    im_end, eos = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    generation = json.loads(Path(path, "generation_config.json").read_text())
    assert generation["eos_token_id"] == [im_end, eos]  # the source's said <|endoftext|> only
    assert generation.get("use_cache", True) is True  # the source was saved without a KV cache
    model = AutoModelForCausalLM.from_pretrained(path)
    prompt = tok.apply_chat_template(CHAT[:1], add_generation_prompt=True, return_tensors="pt",
                                     return_dict=True)
    out = model.generate(**prompt, max_new_tokens=30, do_sample=False)
    assert tok.decode(out[0, prompt["input_ids"].shape[1]:]) == "four<|im_end|>"


def test_the_bytes_tokenizers_export_renders_the_jobs_own_chat_format():
    from training.data.tokenize import ByteEncoder

    chat = [{"role": "system", "content": "Be brief."}, *CHAT,
            {"role": "user", "content": "Grüße?"}]
    tok = export.bytes_tokenizer()
    assert tok.apply_chat_template(chat, tokenize=True, return_dict=False) == \
        ByteEncoder().chat(chat)[0]
    assert tok.apply_chat_template(chat[:2], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) == \
        ByteEncoder().chat(chat[:2])[0] + list(b"<|assistant|>\n")
