"""What the loss trains on is what the model learns: chat data whose user turns are random
characters and whose assistant answer is fixed. Trained on the answers, the training and held-out
losses go near zero; trained on every token, the held-out loss cannot go below the entropy of the
random characters. Real FSDP2 on one gloo rank, the job's tiny model and byte tokenizer, the job's
cache, sampler, training step and evaluation."""

from __future__ import annotations

import json
import math
import random

import pyarrow.fs as pafs
import pytest
import torch

from tests.training.inproc import run_ranks
from training.config import TrainConfig
from training.data.cache import EVAL_FILE, TokenCache
from training.data.packing import Samples
from training.data.source import Source
from training.data.tokenize import BYTES_VOCAB, ByteEncoder
from training.step.engine import build_engine, train_step
from training.run.evaluate import Evaluator
from training.model.model import model_config
from training.step.schedule import Schedule

LETTERS, USER_CHARS, ANSWER = "abcdefghijklmnopqrstuvwxyz", 16, "OK"
CFG = TrainConfig(model="tiny", seq_len=128, micro_batch_size=8, lr=3e-3, warmup_steps=3,
                  steps=60, seed=0)


def _chat_data(path) -> str:
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(400):
            user = "".join(rng.choice(LETTERS) for _ in range(USER_CHARS))
            f.write(json.dumps({"messages": [{"role": "user", "content": user},
                                             {"role": "assistant", "content": ANSWER}]}) + "\n")
    return str(path)


def _train(data: str, directory: str, loss_tokens: str) -> dict:
    fs = pafs.LocalFileSystem()
    cache = TokenCache(fs, directory, loss_tokens)
    cache.build(Source.open(data), ByteEncoder(), CFG.seq_len, loss_tokens, eval_fraction=0.1)
    engine = build_engine(CFG, model_config("tiny", BYTES_VOCAB), torch.device("cpu"))
    samples = Samples(fs, directory)
    held = Samples(fs, directory, EVAL_FILE, "eval_samples")
    evaluator = Evaluator(held.eval_batches(rank=0, world=1, batch=8), 0, CFG.steps)
    schedule, first_eval, losses = Schedule.from_config(CFG), evaluator.loss(engine), []
    for step in range(1, CFG.steps + 1):
        batch = samples.batch((step - 1) * CFG.micro_batch_size, rank=0, world=1, micro=0,
                              batch=CFG.micro_batch_size)
        losses.append(float(train_step(engine, [batch], schedule.lr(step), CFG.grad_clip)))
    return {"first_eval": first_eval, "train": sum(losses[-5:]) / 5,
            "eval": evaluator.loss(engine)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("chat")
    data = _chat_data(d / "chat.jsonl")
    return {mode: run_ranks(1, _train, data, str(d / mode), mode)[0]
            for mode in ("completion", "all")}


def test_trained_on_the_answers_the_training_and_held_out_losses_go_near_zero(trained):
    r = trained["completion"]
    assert r["first_eval"] > 3.0, r  # a fresh model: about ln 257 per byte
    assert r["train"] < 0.05 and r["eval"] < 0.05, r


def test_trained_on_every_token_the_held_out_loss_stays_above_the_random_characters_entropy(
        trained):
    # Per labelled token of a conversation, USER_CHARS of them are uniform over the letters.
    doc = ByteEncoder().chat([{"role": "user", "content": "x" * USER_CHARS},
                              {"role": "assistant", "content": ANSWER}])[0]
    floor = USER_CHARS * math.log(len(LETTERS)) / (len(doc) - 1)
    r = trained["all"]
    assert 0.95 * floor < r["eval"] < r["first_eval"], (floor, r)
