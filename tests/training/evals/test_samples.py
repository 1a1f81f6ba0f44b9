"""--sample-prompts reads the evaluation split the run's cache holds out (one definition, counted
after skipped rows), preference data included (the prompt through the chat template, `chosen`
the reference), and a relative --data still reads from the workers' other directory."""

from __future__ import annotations

import json
import os

import pyarrow.fs as pafs

from training.config import TrainConfig
from training.data.cache import EVAL_FILE, TokenCache, held_out_rows, sft_encoder
from training.data.packing import Samples
from training.data.source import Source
from training.data.synthetic import PAIRS
from training.data.tokenize import ByteEncoder
from training.driver.checks import absolute_paths
from training.evals.samples import prompts


def _chat(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"q{i}"},
                         {"role": "assistant", "content": f"a{i}"}]}


def test_sample_prompts_are_the_documents_the_cache_held_out_after_a_skipped_row(tmp_path):
    path = tmp_path / "chats.jsonl"
    rows = [{"messages": [{"role": "user", "content": "no answer"}]}] + \
        [_chat(i) for i in range(200)]  # the first row cannot train: skipped
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fs = pafs.LocalFileSystem()
    cache = TokenCache(fs, str(tmp_path / "c"), "x")
    index = cache.build(Source.open(str(path)), ByteEncoder(), 15, eval_fraction=0.1)
    held = Samples(fs, cache.directory, EVAL_FILE, "eval_samples").rows(0, index["eval_samples"])
    held_text = ByteEncoder().decode([int(t) & ((1 << 30) - 1) for t in held.reshape(-1)])
    cfg = TrainConfig(data=str(path), tokenizer="bytes", eval_fraction=0.1, sample_prompts=5)
    got = prompts(cfg, 100)
    assert len(got) == index["eval_documents"] > 5
    for p in got:  # each prompt's question and answer are in the held-out file
        assert f"{p.messages[-1]['content']}\n<|assistant|>\n{p.reference}<|endoftext|>" \
            in held_text
    encode = sft_encoder(ByteEncoder(), "completion")
    assert [r["messages"][0]["content"] for r in held_out_rows(Source.open(str(path)), encode,
                                                               0.1)] == \
        [p.messages[-1]["content"] for p in got]


def test_preference_prompts_go_through_the_template_with_chosen_as_the_reference():
    cfg = TrainConfig(objective="dpo", data=str(PAIRS), tokenizer="bytes", eval_fraction=0.05)
    got = prompts(cfg, 3)
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines()]
    by_prompt = {r["chosen"][0]["content"]: r["chosen"][-1]["content"] for r in rows}
    assert len(got) == 3 and all(p.messages and p.messages[-1]["role"] == "user" for p in got)
    assert all(by_prompt[p.messages[0]["content"]] == p.reference for p in got)


def test_a_relative_data_path_is_read_from_another_working_directory(tmp_path, monkeypatch):
    path = tmp_path / "data" / "chats.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(_chat(i)) + "\n" for i in range(100)))
    monkeypatch.chdir(tmp_path)
    cfg = absolute_paths(TrainConfig(data="data/chats.jsonl", eval_data="data/chats.jsonl",
                                     tokenizer="bytes", sample_prompts=2))
    assert cfg.data == cfg.eval_data == str(path)
    os.chdir(tmp_path / "data")  # a worker's own directory
    assert len(prompts(cfg, 2)) == 2
