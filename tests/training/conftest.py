"""Fixtures for tests that run the real job: a tiny tokenizer, S3, an MLflow tracking server (the
shared local Ray is in tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.ports import free_port


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


def _qwen_like(out, eos: str | None = None, extra: tuple[str, ...] = ()):
    """A small byte-level BPE with Qwen2.5's special tokens and chat template (read from
    ../shared/reference/qwen2.5, never copied here), trained on the shipped corpus (+ `extra`),
    with Qwen2's own normalizer and pre-tokenizer: transformers' Qwen2Tokenizer's (NFC, then a
    split by its PRETOKENIZE_REGEX, under which "\n\n" is one pre-token, then byte level
    without GPT-2's regex). GPT-2's pre-tokenizer would hide merges Qwen2's makes."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    from tests.conftest import SHARED, need

    ref = json.loads(need(SHARED / "reference/qwen2.5/tokenizer_config.json").read_text())
    specials = [t["content"] for _, t in sorted(ref["added_tokens_decoder"].items(),
                                                key=lambda kv: int(kv[0]))]
    corpus = (REPO / "training/data/sample_data/tiny_corpus.jsonl").read_text().splitlines()
    qwen2 = Qwen2Tokenizer()._tokenizer  # the real class's pipeline, on an empty vocabulary
    tok = Tokenizer(models.BPE())
    tok.normalizer, tok.pre_tokenizer = qwen2.normalizer, qwen2.pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    paragraphs = ("One paragraph\n\nAnother one\n",) * 20  # Qwen2's vocabulary has "\n\n"
    tok.train_from_iterator([*corpus, *paragraphs, *extra], trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos or ref["eos_token"],
                            pad_token=ref["pad_token"],
                            chat_template=ref["chat_template"]).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def qwen_template_tokenizer(tmp_path_factory):
    """Qwen2.5 Instruct's special tokens, EOS (`<|im_end|>`) and chat template on an offline
    tokenizer: the real template."""
    return _qwen_like(tmp_path_factory.mktemp("qwen-template-tokenizer"))


@pytest.fixture(scope="session")
def qwen_base_tokenizer(tmp_path_factory):
    """As Qwen/Qwen2.5-1.5B (the base model) has it: the same template and specials, EOS
    `<|endoftext|>` while every turn ends in `<|im_end|>`; its BPE has `" Paris"`."""
    return _qwen_like(tmp_path_factory.mktemp("qwen-base-tokenizer"), "<|endoftext|>",
                      ("The capital of France is Paris.",) * 20)


@pytest.fixture()
def s3_server(monkeypatch):
    """An S3-compatible server (moto) on loopback with an empty bucket; yields the bucket name."""
    import boto3

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for key, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
                       "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    deadline = time.time() + 600  # a loaded machine takes long to import moto; a dead one fails
    while True:
        try:
            client.create_bucket(Bucket="ckpt")
            break
        except Exception:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise
            time.sleep(0.3)
    yield client
    proc.kill()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server (`mlflow server`, SQLite backend, artifacts proxied to a
    local directory) on loopback, started once per session; yields its URI."""
    import urllib.request

    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
         "--artifacts-destination", str(root / "artifacts")],
        cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        # No job runner (GenAI evaluation jobs: seven huey worker processes otherwise).
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600  # waits on the server while it lives; a dead one fails at once
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                raise RuntimeError(f"mlflow server did not start (exit {proc.poll()})")
            time.sleep(0.5)
    yield uri
    os.killpg(proc.pid, signal.SIGTERM)  # the server and the workers it started
    proc.wait(timeout=30)


@pytest.fixture()
def no_ray(monkeypatch):
    """cli.run with Ray not started and not startable."""
    import ray

    from training.driver import ray_setup

    def refuse(*_args, **_kwargs):
        raise AssertionError("Ray was started for input that is known bad beforehand")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_setup, "init_ray", refuse)
