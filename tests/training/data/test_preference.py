"""TRL's preference formats become one row per pair: strings or message lists, explicit or
implicit prompts; only the answers train; long pairs keep their starts or are skipped; --preview
shows both answers; bad rows and settings are refused with their reason."""

from __future__ import annotations

import json

import pyarrow.fs as pafs
import pytest

from training.config import TrainConfig
from training.data import DataError
from training.data.packing import decode
from training.data.preference import PairCache, PairSamples, encode_pair, fit, row_of, split
from training.data.preview import preview
from training.data.source import Source
from training.data.tokenize import ByteEncoder
from training.errors import ConfigError
from training.model.dpo import pair_mask, segments
from training.model.loss import IGNORE_INDEX

ENC = ByteEncoder()
USER = [{"role": "user", "content": "sky?"}]


def _said(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def test_an_implicit_prompt_is_the_shared_turns_or_the_shared_words():
    assert split({"chosen": USER + _said("blue"), "rejected": USER + _said("green")}) == \
        (USER, _said("blue"), _said("green"))
    assert split({"chosen": "The sky is blue", "rejected": "The sky is green"}) == \
        ("The sky is ", "blue", "green")
    assert split({"prompt": "q", "chosen": "a", "rejected": "b"}) == ("q", "a", "b")


@pytest.mark.parametrize("row", [
    {"prompt": "sky? ", "chosen": "blue", "rejected": "green"},
    {"prompt": USER, "chosen": _said("blue"), "rejected": _said("green")},
    {"chosen": USER + _said("blue"), "rejected": USER + _said("green")},
])
def test_only_the_answers_train_and_both_share_the_prompt(row):
    (c, ct), (r, rt) = encode_pair(row, ENC)
    trained_c = ENC.decode([i for i, t in zip(c, ct) if t])
    trained_r = ENC.decode([i for i, t in zip(r, rt) if t])
    assert trained_c == "blue<|endoftext|>" and trained_r == "green<|endoftext|>"
    assert c[:ct.index(True)] == r[:rt.index(True)]  # the same prompt tokens


def test_a_prompt_turn_of_the_assistant_is_not_trained():
    earlier = USER + _said("I think") + [{"role": "user", "content": "sure?"}]
    (c, ct), _ = encode_pair({"prompt": earlier, "chosen": _said("yes"),
                              "rejected": _said("no")}, ENC)
    assert ENC.decode([i for i, t in zip(c, ct) if t]) == "yes<|endoftext|>"


@pytest.mark.parametrize("row, why", [
    ({"prompt": "q", "chosen": "a"}, "no `rejected` column"),
    ({"prompt": USER, "chosen": _said("a"), "rejected": [{"role": "user", "content": "x"}]},
     "`rejected` has no token to train on"),
    ({"chosen": [{"role": "robot", "content": "x"}], "rejected": "y"}, "messages[0]"),
    ({"chosen": USER + _said("a"), "rejected": USER + _said("a")}, "no answer of its own"),
])
def test_a_bad_row_is_refused_with_its_reason(tmp_path, row, why):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n"
                    + json.dumps(row) + "\n")
    with pytest.raises(DataError, match="row 2: .*" + why.replace("[", r"\[")):
        PairCache(pafs.LocalFileSystem(), str(tmp_path / "c"), "x").build(
            Source.open(str(path)), ENC, 63)


def test_a_long_pair_keeps_its_starts_and_one_without_an_answer_is_skipped(tmp_path):
    pair = encode_pair({"prompt": "p" * 10, "chosen": "c" * 40, "rejected": "r" * 5}, ENC)
    (c, _), (r, _) = fit(pair, 32)
    assert len(c) + len(r) == 32 and len(r) == 16 and c[:10] == pair[0][0][:10]
    assert fit(encode_pair({"prompt": "p" * 30, "chosen": "c", "rejected": "r"}, ENC), 32) \
        is None
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "p" * 30, "chosen": "c", "rejected": "r"},
        {"prompt": "q", "chosen": "a", "rejected": "b"}]) + "\n")
    index = PairCache(pafs.LocalFileSystem(), str(tmp_path / "c"), "x").build(
        Source.open(str(path)), ENC, 31)
    assert (index["samples"], index["skipped_pairs"]) == (1, 1)


def test_a_row_holds_the_chosen_then_the_rejected_document_then_padding(tmp_path):
    pair = encode_pair({"prompt": "q", "chosen": "ab", "rejected": "cde"}, ENC)
    b = decode(row_of(pair, 16)[None])
    seg = segments(b.positions)[0]
    labelled = b.labels[0] != IGNORE_INDEX
    assert ENC.decode(b.labels[0][labelled & (seg == 0)].tolist()) == "ab<|endoftext|>"
    assert ENC.decode(b.labels[0][labelled & (seg == 1)].tolist()) == "cde<|endoftext|>"
    assert not labelled[seg >= 2].any() and bool(pair_mask(b.labels, b.positions)[0])


def test_training_reads_every_pair_once_an_epoch_in_a_seeded_order(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"{i}", "chosen": "a", "rejected": "b"})
                              for i in range(10)) + "\n")
    fs = pafs.LocalFileSystem()
    PairCache(fs, str(tmp_path / "c"), "x").build(Source.open(str(path)), ENC, 15)
    samples = PairSamples(fs, str(tmp_path / "c"), seed=3)
    first, second = ([samples.index(i) for i in range(e * 10, e * 10 + 10)] for e in (0, 1))
    assert sorted(first) == sorted(second) == list(range(10)) and first != second
    assert [PairSamples(fs, str(tmp_path / "c"), seed=3).index(i) for i in range(10, 20)] \
        == second  # a pure function of the sample number: a resume continues the same order


def test_preview_shows_both_answers_and_what_trains(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"chosen": USER + _said("blue"),
                                "rejected": USER + _said("green")}) + "\n")
    cfg = TrainConfig(objective="dpo", data=str(path), tokenizer="bytes")
    (row,) = preview(cfg, ENC, 1)
    assert row["chosen"].endswith("blue<|endoftext|>") and "sky?" in row["rejected"]
    assert row["trained"] == {"chosen": ["blue<|endoftext|>"],
                              "rejected": ["green<|endoftext|>"]}


@pytest.mark.parametrize("settings, flag", [
    ({"objective": "dpo"}, "--objective dpo needs preference --data files"),
    ({"objective": "dpo", "data": "x.jsonl", "dpo_beta": 0.0}, "--dpo-beta must be"),
    ({"objective": "ppo"}, "--objective must be one of"),
])
def test_bad_dpo_settings_are_refused(settings, flag):
    with pytest.raises(ConfigError, match=flag):
        TrainConfig(**settings).validated()
