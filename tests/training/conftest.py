"""Fixtures for tests that run the real job: a tiny tokenizer, S3 (the shared local Ray is in
tests/conftest.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A byte-level BPE tokenizer trained here on the shipped sample (no hub downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = (REPO / "training/data/sample_data/tiny_corpus.jsonl").read_text().splitlines()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"]))
    out = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def qwen_template_tokenizer(tmp_path_factory):
    """A small byte-level BPE with Qwen2.5's special tokens, EOS and chat template (read from
    ../shared/reference/qwen2.5, never copied here): the real template on an offline tokenizer."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tests.conftest import SHARED, need

    ref = json.loads(need(SHARED / "reference/qwen2.5/tokenizer_config.json").read_text())
    specials = [t["content"] for _, t in sorted(ref["added_tokens_decoder"].items(),
                                                key=lambda kv: int(kv[0]))]
    corpus = (REPO / "training/data/sample_data/tiny_corpus.jsonl").read_text().splitlines()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out = tmp_path_factory.mktemp("qwen-template-tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=ref["eos_token"],
                            pad_token=ref["pad_token"],
                            chat_template=ref["chat_template"]).save_pretrained(out)
    return out


@pytest.fixture()
def s3_server(monkeypatch):
    """An S3-compatible server (moto) on loopback with an empty bucket; yields the bucket name."""
    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
                       "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    deadline = time.time() + 30
    while True:
        try:
            client.create_bucket(Bucket="ckpt")
            break
        except Exception:
            if time.time() > deadline:
                proc.kill()
                raise
            time.sleep(0.3)
    yield client
    proc.kill()


@pytest.fixture()
def no_ray(monkeypatch):
    """cli.run with Ray not started and not startable."""
    import ray

    from training import cli

    def refuse(*_args, **_kwargs):
        raise AssertionError("Ray was started for input that is known bad beforehand")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cli, "init_ray", refuse)
