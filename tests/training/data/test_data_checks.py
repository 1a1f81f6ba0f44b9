"""Data that cannot train is refused by the job before Ray starts, naming the file and row; the
identity of S3 data covers its object listing, so a resume on changed data is refused."""

from __future__ import annotations

import dataclasses
import json
import time

import pyarrow.fs as pafs
import pytest

from training.driver import cli
from training.driver import plan as run_plan
from training.run import checkpoint
from training.data.cache import ID_MASK, TokenCache, fingerprint
from training.data.packing import Samples
from training.data.source import Source
from training.data.tokenize import BYTES, ByteEncoder
from training.step.schedule import Schedule

pytestmark = pytest.mark.usefixtures("no_ray")


def run(tmp_path, *flags: str) -> dict:
    return cli.run(cli.parse(["--local", "--storage-path", str(tmp_path / "runs"),
                              "--tokenizer", BYTES, *flags]))


def run_dir(tmp_path, *flags: str):
    """Where `run(tmp_path, *flags)` keeps its run (named from what defines it)."""
    return tmp_path / "runs" / cli.parse(["--local", "--tokenizer", BYTES, *flags]).name


def _jsonl(path, *rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


@pytest.mark.parametrize("second_row, message", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "row 2: no token to train on"),
    ({"messages": [{"role": "user"}]}, r"row 2: messages\[0\] must be"),
    ({"messages": "hi"}, "row 2: `messages` must be a non-empty list"),
    ({"prompt": "a", "completion": "b"}, "row 2: no `messages` column"),
    ('{"messages": [', "row 2: not JSON"),
    ('[{"role": "user", "content": "hi"}]', "row 2: a JSON object per line, got list"),
])
def test_a_bad_row_is_refused_with_its_file_and_row(tmp_path, second_row, message):
    data = _jsonl(tmp_path / "chat.jsonl", GOOD, second_row, second_row)  # two: over one row
    with pytest.raises(ValueError, match=f"{tmp_path}/chat.jsonl {message}"):
        run(tmp_path, "--data", data)
    assert not list((tmp_path / "runs").glob("*/tokens-*"))  # nothing half-written is left


def test_an_empty_document_and_unknown_columns_are_refused(tmp_path):
    data = _jsonl(tmp_path / "t.jsonl", {"text": "fine"}, {"text": ""}, {"text": ""})
    with pytest.raises(ValueError, match="row 2: no token to train on .empty text"):
        run(tmp_path, "--data", data)
    data = _jsonl(tmp_path / "other.jsonl", {"question": "a", "answer": "b"})
    with pytest.raises(ValueError, match=r"row 1: no `text`, `prompt` \+ `completion` or "
                                         "`messages` column .found question, answer"):
        run(tmp_path, "--data", data)


def test_data_too_short_for_one_sample_is_refused(tmp_path):
    data = _jsonl(tmp_path / "t.jsonl", {"text": "short"})
    with pytest.raises(ValueError, match="holds no text .or too little to fill one 65-token "
                                         "sample.; add data or lower --seq-len"):
        run(tmp_path, "--data", data, "--seq-len", "64")
    cache = TokenCache(pafs.LocalFileSystem(), str(tmp_path / "c"), "x")
    cache.build(Source.open(data), ByteEncoder(), 64)
    with pytest.raises(ValueError, match="holds no full sample"):  # what a worker would say
        Samples(cache.fs, cache.directory)


class _WideIds(ByteEncoder):
    """Ids past the 30 bits a cached token keeps for its id."""

    def encode(self, text: str) -> list[int]:
        return [ID_MASK + 1 + b for b in text.encode()]


def test_a_token_id_the_cache_cannot_hold_is_refused_and_nothing_is_left(tmp_path):
    data = _jsonl(tmp_path / "t.jsonl", {"text": "a"})
    cache = TokenCache(pafs.LocalFileSystem(), str(tmp_path / "c"), "x")
    with pytest.raises(ValueError, match=f"t.jsonl row 1: token id {ID_MASK + 1 + ord('a')} is "
                                         "beyond the 1,073,741,824 this cache can hold"):
        cache.build(Source.open(data), _WideIds(), 8)
    assert not (tmp_path / "c").exists()


def test_token_ids_beyond_the_models_vocabulary_are_refused(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = tmp_path / "small-vocab"  # a whole model directory: --model is checked for weights
    Qwen2ForCausalLM(Qwen2Config(vocab_size=100, hidden_size=16, intermediate_size=32,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1)).save_pretrained(model)
    data = _jsonl(tmp_path / "t.jsonl", {"text": "bytes reach 256"})
    with pytest.raises(ValueError, match="token ids reach 256 .tokenizer 'bytes'. but --model "
                                         f"'{model}' has a vocabulary of 100"):
        run(tmp_path, "--data", data, "--model", str(model))


def _put(client, key: str, rows: list[dict]) -> None:
    client.put_object(Bucket="ckpt", Key=key, Body="".join(json.dumps(r) + "\n" for r in rows))


def test_s3_data_identity_covers_its_listing_and_a_resume_on_changed_data_is_refused(
        tmp_path, s3_server):
    _put(s3_server, "data/a.jsonl", [{"text": "first file"}])
    uri = "s3://ckpt/data/"
    before = fingerprint(Source.open(uri), BYTES, 8)
    cache = TokenCache(pafs.LocalFileSystem(), str(tmp_path / "c"), before)
    assert cache.build(Source.open(uri), ByteEncoder(), 8)["documents"] == 1  # read from S3
    assert fingerprint(Source.open(uri), BYTES, 8) == before  # stable while nothing changes
    saved = run_dir(tmp_path, "--data", uri, "--seq-len", "8") / "checkpoint-step0000002"
    saved.mkdir(parents=True)
    (saved / "COMPLETE").write_text("")
    state = checkpoint.RunState(step=2, samples_seen=8, data=f"{before}-seed0",  # DataPlan's id
                                schedule=Schedule(1e-3, 5, 30).to_dict())
    (saved / checkpoint.STATE_FILE).write_text(json.dumps(dataclasses.asdict(state)))
    _put(s3_server, "data/b.jsonl", [{"text": "an added file"}])
    added = fingerprint(Source.open(uri), BYTES, 8)
    time.sleep(1.1)  # S3's last-modified time has a resolution of a second
    _put(s3_server, "data/a.jsonl", [{"text": "first edit"}])  # same key and size, new content
    assert len({before, added, fingerprint(Source.open(uri), BYTES, 8)}) == 3
    with pytest.raises(ValueError, match="trained on other data: the contents of --data "
                                         "s3://ckpt/data/ changed since its checkpoint"):
        run(tmp_path, "--data", uri, "--seq-len", "8")


def test_chat_data_on_a_built_in_shape_without_a_tokenizer_names_bytes(tmp_path):
    data = _jsonl(tmp_path / "chat.jsonl", GOOD)
    with pytest.raises(ValueError, match="needs a tokenizer with the built-in shape 'tiny': pass "
                                         "--tokenizer bytes .UTF-8 bytes, built in"):
        cli.run(cli.parse(["--local", "--storage-path", str(tmp_path / "runs"), "--data", data]))


def test_epochs_derive_the_steps_from_the_samples_and_the_batch(tmp_path, capsys):
    from training.data.synthetic import SHIPPED

    flags = ["--local", "--storage-path", str(tmp_path / "runs"), "--tokenizer", BYTES,
             "--data", str(SHIPPED), "--seq-len", "64", "--micro-batch-size", "3"]
    plan, _ = run_plan.build(cli.parse([*flags, "--epochs", "1.5"]))
    cfg, data = plan.cfg, plan.data
    index = TokenCache(pafs.LocalFileSystem(), data.directory, "").index()
    per_step = 2 * 3  # two workers of three sequences
    assert cfg.steps == data.steps == -(-3 * index["samples"] // (2 * per_step))  # rounded up
    assert f"{cfg.steps} steps of 6 samples = 1.50 epochs" in capsys.readouterr().out
    cfg = run_plan.build(cli.parse([*flags, "--steps", "7"]))[0].cfg
    assert cfg.steps == 7 and f"7 steps of 6 samples = {42 / index['samples']:.2f} epochs" in \
        capsys.readouterr().out


def test_a_finished_run_is_left_alone_and_says_so(tmp_path, capsys):
    from training.run.handoff import SUMMARY_FILE

    data = _jsonl(tmp_path / "chat.jsonl", *[GOOD] * 40)
    summary = run_dir(tmp_path, "--data", data, "--seq-len", "32") / SUMMARY_FILE
    summary.parent.mkdir(parents=True)
    summary.write_text(json.dumps({"steps": 4, "last_loss": 0.5, "export_path": "/x/hf_model"}))
    before = summary.read_bytes()
    done = run(tmp_path, "--data", data, "--seq-len", "32", "--steps", "4")  # Ray never starts
    assert (done.steps, done.last_loss, done.export_path) == (4, 0.5, "/x/hf_model")
    assert summary.read_bytes() == before
    assert f"run {summary.parent.name!r} finished at step 4 of 4 already" in \
        capsys.readouterr().out


def _preview(capsys, *flags: str) -> list[dict]:
    assert cli.main(["--preview", *flags]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_preview_shows_the_rows_and_the_spans_the_loss_trains_on(tmp_path, capsys,
                                                                 qwen_base_tokenizer):
    tok = ["--tokenizer", str(qwen_base_tokenizer), "--data"]
    chats = _jsonl(tmp_path / "chats.jsonl",
                   {"messages": [{"role": "assistant", "content": "Hi! Ask me."},
                                 {"role": "user", "content": "2+2?"},
                                 {"role": "assistant", "content": "4"}]},
                   {"messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "3+3?"},
                                 {"role": "assistant", "content": "6"},
                                 {"role": "user", "content": "and 4+4?"},
                                 {"role": "assistant", "content": "8"}]}, GOOD)
    first, second = _preview(capsys, "2", *tok, chats)
    assert first["text"].startswith("<|im_start|>system\nYou are Qwen")
    assert first["trained"] == ["Hi! Ask me.<|im_end|>", "4<|im_end|>"]
    assert second["trained"] == ["6<|im_end|>", "8<|im_end|>"]
    pairs = _jsonl(tmp_path / "pairs.jsonl", {"prompt": "The capital of France is ",
                                              "completion": "Paris"})
    assert _preview(capsys, "5", *tok, pairs) == [
        {"text": "The capital of France is Paris<|endoftext|>", "trained": ["Paris<|endoftext|>"]}]
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("**/tokens-*"))


def test_preview_refuses_random_tokens_and_names_a_bad_row(tmp_path, capsys):
    assert cli.main(["--preview", "3", "--data", "random"]) == cli.EXIT_BAD_INPUT
    assert "--preview needs a count of at least 1 and --data files" in capsys.readouterr().err
    bad = _jsonl(tmp_path / "chat.jsonl", GOOD, *[{"messages": "hi"}] * 2)
    assert cli.main(["--preview", "3", "--tokenizer", BYTES, "--data", bad]) == cli.EXIT_BAD_INPUT
    assert f"{bad} row 2: `messages` must be a non-empty list" in capsys.readouterr().err


def test_a_chat_set_with_newline_answers_u2028_and_a_json_array_trains_on_every_row(
        tmp_path, qwen_base_tokenizer):
    """Under Qwen2's real pre-tokenizer: JSON Lines whose strings hold U+2028/U+2029/U+0085
    (json.dumps(ensure_ascii=False) writes them raw: valid JSON Lines), and a `.json` array,
    as `datasets` reads it; every row is a document, none skipped."""
    from training.data.tokenize import HFEncoder

    def chat(answer: str) -> dict:
        return {"messages": [{"role": "user", "content": "Say it"},
                             {"role": "assistant", "content": answer}]}

    rows = [chat("\nline\u2028sep"), chat("para\u2029graph"), chat("\n\nnext\u0085line")]
    (tmp_path / "data").mkdir()
    (tmp_path / "data/a.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "data/b.json").write_text(json.dumps([chat("\nfrom an array")] * 2, indent=2))
    source = Source.open(str(tmp_path / "data"))
    assert [n for _, n, _ in source.rows()] == [1, 2, 3, 1, 2]
    cache = TokenCache(pafs.LocalFileSystem(), str(tmp_path / "c"), "x")
    index = cache.build(source, HFEncoder(str(qwen_base_tokenizer)), 16, pad=True)
    assert index["documents"] == 5 and index["skipped_rows"] == 0


def test_one_row_that_cannot_train_is_skipped_with_a_count_and_its_reason(tmp_path):
    """One odd row never ends a run: it is skipped, counted and named in the data line; more
    than max(1 row, cache.SKIP_SHARE of the rows) (the tests above: two of three) refuse the
    data; one bad row of a 61-row file is skipped."""
    from training.config import TrainConfig
    from training.data.cache import SKIP_SHARE
    from training.data.prepare import describe

    good = [{"text": f"document {i} " * 8} for i in range(int(2 / SKIP_SHARE))]
    data = _jsonl(tmp_path / "t.jsonl", *good[:50], {"text": ""}, *good[50:])
    cache = TokenCache(pafs.LocalFileSystem(), str(tmp_path / "c"), "x")
    index = cache.build(Source.open(data), ByteEncoder(), 32)
    assert index["documents"] == len(good) and index["skipped_rows"] == 1
    assert index["skipped_reasons"] == [f"{data} row 51: no token to train on (empty text)"]
    small = _jsonl(tmp_path / "s.jsonl", *good[:60], {"text": ""})
    assert TokenCache(pafs.LocalFileSystem(), str(tmp_path / "s"), "x").build(
        Source.open(small), ByteEncoder(), 32)["skipped_rows"] == 1
    line = describe(TrainConfig(data=data, tokenizer=BYTES, seq_len=32), index, None)
    assert line.endswith(f"; skipped 1 row(s) that cannot be trained on: {data} row 51: no "
                         "token to train on (empty text)")
