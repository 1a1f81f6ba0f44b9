"""What a run leaves behind and how the next one starts from it, on 2 in-process gloo ranks (no
Ray): pretrained weights read by rank 0 only and sharded exactly, the exported Hugging Face
directory reloaded by transformers, its COMPLETE marker, model directories checked up front."""

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


def _on_rank(model_dir: str, export_root: str) -> dict:
    """Both halves on one gloo group (one spawn costs more than either half)."""
    return {"load": _load_on_rank(model_dir), "export": _train_and_export(export_root)}


@pytest.fixture(scope="module")
def ranks(pretrained_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    return root, run_ranks(2, _on_rank, str(pretrained_dir), str(root))


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
        assert len(r["load"]["load_host_rss_gib"]) == 2 and r["load"]["load_s"] > 0


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
