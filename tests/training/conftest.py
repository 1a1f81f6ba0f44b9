"""Fixtures for tests that run the real job: one local Ray for the session, a tiny tokenizer, S3."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray shared by the job tests (starting one per test would triple the suite's time)."""
    import ray

    from training import quiet

    quiet.install()
    from training.ray_setup import worker_env

    # The controller polls workers every 2 s by default; faster polls, shorter tests.
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR",
             runtime_env={"env_vars": {**worker_env(), "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A byte-level BPE tokenizer trained here on the shipped sample (no hub downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [line for line in (REPO / "training/sample_data/tiny_corpus.jsonl").read_text().splitlines()]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"]))
    out = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(out)
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
