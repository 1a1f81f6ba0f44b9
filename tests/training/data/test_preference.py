"""TRL's preference formats become packed pair rows: strings or message lists, explicit or
implicit prompts (TRL's extract_prompt itself the reference); only the answers train; long pairs
truncated and dropped as TRL's DPOTrainer does, and counted; --preview shows both answers; a bad
row is skipped and counted as SFT's are, too many refuse the data."""

from __future__ import annotations

import json

import pyarrow.fs as pafs
import pytest

from training.config import TrainConfig
from training.data import DataError
from training.data.packing import decode, row_of
from training.data.preference import PairCache, PairSamples, encode_pair, split, truncate
from training.data.prepare import describe, row_counts
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


@pytest.mark.parametrize("chosen, rejected", [
    ("The sky is blue", "The sky is green"), ("a cat", "a car"), ("same", "same and more"),
    (" lead", " leaf"), ("x", "y"),
    (USER + _said("blue"), USER + _said("green")),
    (USER + _said("a") + USER + _said("b"), USER + _said("a") + USER + _said("c")),
    (USER + _said("one"), USER + _said("one") + USER + _said("two")),
])
def test_an_implicit_prompt_is_split_as_trls_extract_prompt(chosen, rejected):
    from trl.data_utils import extract_prompt

    want = extract_prompt({"chosen": chosen, "rejected": rejected})
    assert split({"chosen": chosen, "rejected": rejected}) == \
        (want["prompt"], want["chosen"], want["rejected"])
    assert split({"prompt": "q", "chosen": "a", "rejected": "b"}) == ("q", "a", "b")


def test_a_string_prompt_and_answer_tokenize_as_the_whole_text(tokenizer_dir):
    """TRL tokenizes prompt + answer as one text: the split's tokens are the whole text's, and
    the answer starts with its space (no lone ' ' token scored before it)."""
    from training.data.tokenize import HFEncoder

    enc = HFEncoder(str(tokenizer_dir))
    row = {"chosen": "The sky is blue", "rejected": "The sky is green"}
    (c, ct), (r, rt) = encode_pair(row, enc)
    assert c == enc.encode("The sky is blue") + [enc.eos]
    assert enc.decode([i for i, t in zip(c, ct) if t]).startswith(" blue")
    assert r == enc.encode("The sky is green") + [enc.eos]


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
    ({"chosen": [{"role": "robot", "content": "x"}], "rejected": [{"role": "robot"}]},
     "messages[0]"),
    ({"chosen": USER + _said("a"), "rejected": USER + _said("a")}, "the same answer"),
    ({"chosen": "a", "rejected": USER}, "must both be strings or both message lists"),
])
def test_a_bad_row_is_skipped_and_counted_and_two_refuse_a_small_file(tmp_path, row, why):
    good = json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n"
    path = tmp_path / "one.jsonl"
    path.write_text(good * 3 + json.dumps(row) + "\n")
    index = PairCache(pafs.LocalFileSystem(), str(tmp_path / "c"), "x").build(
        Source.open(str(path)), ENC, 63)
    assert index["documents"] == 3 and index["skipped_rows"] == 1
    assert why in index["skipped_reasons"][0] and "row 4: " in index["skipped_reasons"][0]
    path = tmp_path / "two.jsonl"
    path.write_text(good * 3 + (json.dumps(row) + "\n") * 2)
    with pytest.raises(DataError, match="row 4: .*" + why.replace("[", r"\[") + ".*2 of 5"):
        PairCache(pafs.LocalFileSystem(), str(tmp_path / "d"), "x").build(
            Source.open(str(path)), ENC, 63)


def _trl_trains(pair, max_length: int) -> list[list[int]]:
    """What TRL's collator trains of a pair (prompt_ids / chosen_ids / rejected_ids as its
    tokenization leaves them) at max_length, keep_start."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    (c, ct), (r, rt) = pair
    n = ct.index(True)
    batch = DataCollatorForPreference(pad_token_id=0, max_length=max_length)(
        [{"prompt_ids": c[:n], "chosen_ids": c[n:], "rejected_ids": r[n:]}])
    return [[int(i) for i, m in zip(ids, mask) if m]
            for ids, mask in zip(batch["input_ids"], batch["completion_mask"])]


@pytest.mark.parametrize("prompt, max_length", [(10, 32), (30, 32), (31, 32), (32, 32),
                                                  (480, 1024), (700, 1024)])
def test_long_pairs_truncate_and_drop_as_trls_dpotrainer(tmp_path, prompt, max_length):
    pair = encode_pair({"prompt": "p" * prompt, "chosen": "c" * 200, "rejected": "r" * 5}, ENC)
    kept = truncate(pair, max_length)
    if prompt >= max_length:  # TRL's filter: len(prompt_ids) < max_length
        assert kept is None
        return
    ours = [[i for i, t in zip(ids, trained) if t] for ids, trained in kept]
    assert ours == _trl_trains(pair, max_length)
    assert all(len(ids) <= max_length for ids, _ in kept)


def test_truncated_and_dropped_pairs_are_counted_and_rows_hold_every_fitting_pair(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "p" * 40, "chosen": "c", "rejected": "r"},  # prompt fills max_length: dropped
        {"prompt": "q" * 30, "chosen": "a" * 20, "rejected": "b"},  # truncated
        *[{"prompt": f"{i}", "chosen": "a", "rejected": "b"} for i in range(20)]]) + "\n")
    index = PairCache(pafs.LocalFileSystem(), str(tmp_path / "c"), "x").build(
        Source.open(str(path)), ENC, 31)
    assert (index["dropped_pairs"], index["truncated_pairs"], index["documents"]) == (1, 1, 21)
    # rows of 63: the truncated pair (31 + 31), then 10 pairs of 6 tokens, then 7 and 3 of 8
    assert index["sample_tokens"] == 63 and index["samples"] == 4
    assert index["pairs_per_row"] == 10 and index["real_tokens"] == 62 + 10 * 6 + 10 * 8
    line = describe(TrainConfig(objective="dpo", data=str(path), tokenizer="bytes", seq_len=31),
                    index, None)
    assert "21 pairs (each sequence at most 31 tokens: 1 truncated, 1 dropped" in line
    assert row_counts(index) == {"skipped_rows": 0, "dropped_pairs": 1, "truncated_pairs": 1}


def test_a_row_holds_each_pairs_chosen_then_rejected_document_then_padding():
    pairs = [encode_pair({"prompt": "q", "chosen": a, "rejected": b}, ENC)
             for a, b in (("ab", "cde"), ("f", "gh"))]
    b = decode(row_of(pairs, 40)[None])
    seg = segments(b.positions)[0]
    labelled = b.labels[0] != IGNORE_INDEX
    said = [ENC.decode(b.labels[0][labelled & (seg == k)].tolist()) for k in range(4)]
    assert said == ["ab<|endoftext|>", "cde<|endoftext|>", "f<|endoftext|>", "gh<|endoftext|>"]
    assert not labelled[seg >= 4].any()
    assert pair_mask(b.labels, b.positions, 3).tolist() == [[True, True, False]]


def test_training_reads_every_pair_once_an_epoch_in_a_seeded_order(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"{i}", "chosen": "a", "rejected": "b"})
                              for i in range(10)) + "\n")
    fs = pafs.LocalFileSystem()
    PairCache(fs, str(tmp_path / "c"), "x").build(Source.open(str(path)), ENC, 5)
    samples = PairSamples(fs, str(tmp_path / "c"), seed=3)
    assert samples.n == 10 and samples.pairs == 1  # pairs of 6 tokens in rows of 11
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


def test_the_dpo_demo_trains_on_the_shipped_pairs_its_generator_writes():
    from training.data.synthetic import PAIRS, examples, preference_pairs, render
    from training.driver import cli

    cfg, _ = cli.parse_args(["--demo", "--objective", "dpo"])
    assert cfg.data == str(PAIRS) and cfg.eval_fraction == 0.05
    assert PAIRS.read_text() == render(preference_pairs(examples()))
