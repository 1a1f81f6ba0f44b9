"""The data path without Ray: packing into samples with labels and per-document positions, the
evaluation split, positions by count and each epoch's seeded document order (exact resumes), and
the identity of a source."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.fs as pafs
import pytest

from training.data.cache import (EVAL_FILE, INDEX_FILE, START, TOKENS_FILE, TRAINED, TokenCache,
                                 fingerprint)
from training.data.packing import Samples, decode, sample_start
from training.data.source import Source
from training.data.tokenize import BYTES, ByteEncoder
from training.model.loss import IGNORE_INDEX

EOS = ByteEncoder.eos

def _consumed(samples_seen: int, steps: int, world: int, accum: int,
              batch: int) -> tuple[list, int]:
    """Sample indices every rank reads over `steps` optimizer steps, as the loop advances."""
    seen = []
    for _ in range(steps):
        for rank in range(world):
            for micro in range(accum):
                start = sample_start(samples_seen, rank=rank, world=world, micro=micro, batch=batch)
                seen.extend(range(start, start + batch))
        samples_seen += world * accum * batch  # what training/run/loop.py adds per step
    return seen, samples_seen


def test_every_sample_once_across_ranks_and_a_resume_with_another_world_size_and_batch():
    first, position = _consumed(0, steps=5, world=2, accum=1, batch=2)
    second, end = _consumed(position, steps=4, world=3, accum=2, batch=1)
    assert sorted(first + second) == list(range(end)) and end == 20 + 24


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _documents(fs, directory: str, file: str) -> list[list[int]]:
    """The documents of a packed file, split at their start flags."""
    raw = np.frombuffer(fs.open_input_file(f"{directory}/{file}").read(), dtype="<u4")
    docs: list[list[int]] = []
    for v in raw:
        if v & START:
            docs.append([])
        docs[-1].append(int(v & ~(START | TRAINED)))
    return docs


def test_packed_samples_carry_labels_and_positions_that_restart_at_each_document(tmp_path):
    src = _write(tmp_path / "pc.jsonl", [{"prompt": "ab", "completion": "c"},
                                         {"prompt": "d", "completion": "ef"}])
    cache = TokenCache(pafs.LocalFileSystem(), str(tmp_path / "c"), "x")
    index = cache.build(Source.open(src), ByteEncoder(), seq_len=7)  # 8 = 4 + 4 tokens
    assert (index["samples"], index["data_format"]) == (1, "prompt-completion")
    batch = Samples(cache.fs, cache.directory).batch(0, rank=0, world=1, micro=0, batch=1)
    assert batch.inputs.tolist() == [[*b"abc", EOS, *b"def"]]
    assert batch.positions.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    # Labels: the completion and EOS of each document; never the next document's first token.
    n = IGNORE_INDEX
    assert batch.labels.tolist() == [[n, ord("c"), EOS, n, ord("e"), ord("f"), EOS]]


def test_samples_are_rows_of_the_file_wrapping_into_the_next_epoch(tmp_path):
    rows = (np.arange(15).reshape(5, 3) | TRAINED).astype("<u4")
    d = tmp_path / "tokens-x"
    d.mkdir()
    (d / TOKENS_FILE).write_bytes(rows.tobytes() + b"\x07\x00\x00\x00")  # + a partial tail
    (d / INDEX_FILE).write_text(json.dumps({"samples": 5, "sample_tokens": 3}))
    samples = Samples(pafs.LocalFileSystem(), str(d))
    assert samples.rows(3, 4).tolist() == rows[[3, 4, 0, 1]].tolist()
    batch = samples.batch(4, rank=1, world=2, micro=0, batch=2)  # samples 6, 7 = rows 1, 2
    ids = rows & ~TRAINED
    assert batch.inputs.tolist() == ids[[1, 2], :-1].tolist()
    assert batch.labels.tolist() == ids[[1, 2], 1:].tolist()
    (d / INDEX_FILE).unlink()
    with pytest.raises(ValueError, match="incomplete"):
        Samples(pafs.LocalFileSystem(), str(d))


def test_held_out_documents_are_never_in_the_training_file_and_each_is_evaluated_once(tmp_path):
    rows = [{"text": f"document {i:03d}"} for i in range(60)]  # 12 bytes + EOS: one sample each
    src = Source.open(_write(tmp_path / "t.jsonl", rows))
    cache = TokenCache(pafs.LocalFileSystem(), str(tmp_path / "c"), "x")
    index = cache.build(src, ByteEncoder(), seq_len=12, eval_fraction=0.2)
    train = {bytes(d[:-1]).decode() for d in _documents(cache.fs, cache.directory, TOKENS_FILE)}
    held = {bytes(d[:-1]).decode() for d in _documents(cache.fs, cache.directory, EVAL_FILE)}
    assert not train & held and train | held == {r["text"] for r in rows}
    assert 9 <= len(held) <= 15 and index["eval_documents"] == len(held)
    # Evaluation reads every held-out sample once over the ranks (all 12 of its labels), the
    # same number of micro-batches on each, the shortfall as rows with no label.
    ev = Samples(cache.fs, cache.directory, EVAL_FILE, "eval_samples")
    parts = [ev.eval_batches(rank=r, world=2, batch=5) for r in range(2)]
    assert len(parts[0]) == len(parts[1]) and 2 * 5 * len(parts[0]) > len(held)
    read = [(bytes(i).decode(), int((lab != IGNORE_INDEX).sum()))
            for p in parts for b in p for i, lab in zip(b.inputs.tolist(), b.labels)
            if (lab != IGNORE_INDEX).any()]
    assert sorted(read) == sorted((text, 12) for text in held)
    assert sum(int((b.labels != IGNORE_INDEX).sum()) for p in parts for b in p) == 12 * len(held)


def test_tokenized_once_in_the_files_order_and_reused(tmp_path):
    src = tmp_path / "text"
    src.mkdir()
    docs = {name: [f"{name} document {i} " * (i + 1) for i in range(30)] for name in "bca"}
    for name, texts in docs.items():
        _write(src / f"{name}.jsonl", [{"text": t} for t in texts])
    expected = [i for name in sorted(docs) for t in docs[name] for i in [*t.encode(), EOS]]
    fs = pafs.LocalFileSystem()
    builds = []
    for run in ("one", "two"):
        cache = TokenCache.for_run(fs, str(tmp_path / run), Source.open(str(src)), BYTES, 15)
        index = cache.build(Source.open(str(src)), ByteEncoder(), 15)
        builds.append((tmp_path / run / f"tokens-{cache.fingerprint}" / TOKENS_FILE).read_bytes())
    assert builds[0] == builds[1]  # the same samples in the same order, every time
    packed = np.frombuffer(builds[0], dtype="<u4") & ~(START | TRAINED)
    assert packed.tolist() == expected and index["samples"] == len(expected) // 16
    tokens_file = tmp_path / "two" / f"tokens-{cache.fingerprint}" / TOKENS_FILE
    tokens_file.write_bytes(b"")  # a rerun reads the existing index and tokenizes nothing again
    assert cache.build(Source.open(str(src)), ByteEncoder(), 15) == index
    assert tokens_file.read_bytes() == b""


def test_a_copy_of_local_data_is_the_same_data_and_an_edit_is_not(tmp_path):
    a = _write(tmp_path / "a.jsonl", [{"text": "one"}])
    (tmp_path / "copy").mkdir()
    b = _write(tmp_path / "copy" / "a.jsonl", [{"text": "one"}])
    assert fingerprint(Source.open(a), BYTES, 8) == fingerprint(Source.open(b), BYTES, 8)
    _write(tmp_path / "copy" / "a.jsonl", [{"text": "two"}])  # same size, other content
    assert fingerprint(Source.open(a), BYTES, 8) != fingerprint(Source.open(b), BYTES, 8)
    assert fingerprint(Source.open(a), BYTES, 8) != fingerprint(Source.open(a), BYTES, 8,
                                                                eval_fraction=0.1)


def _shuffled(tmp_path, seed: int):
    rows = [{"text": f"document {i:03d}" + "." * (i % 7)} for i in range(60)]
    tmp_path.mkdir(parents=True, exist_ok=True)
    cache = TokenCache(pafs.LocalFileSystem(), str(tmp_path / "c"), "x")
    cache.build(Source.open(_write(tmp_path / "t.jsonl", rows)), ByteEncoder(), seq_len=15)
    return Samples(cache.fs, cache.directory, seed=seed), \
        _documents(cache.fs, cache.directory, TOKENS_FILE)


def test_every_epoch_reads_every_document_once_in_its_own_seeded_order(tmp_path):
    samples, docs = _shuffled(tmp_path, seed=0)
    orders = [samples.order.order(e).tolist() for e in range(3)]
    assert all(sorted(o) == list(range(len(docs))) for o in orders)
    assert len({tuple(o) for o in orders + [list(range(len(docs)))]}) == 4  # none is file order
    assert _shuffled(tmp_path / "again", seed=1)[0].order.order(0).tolist() != orders[0]
    for epoch, order in enumerate(orders):  # the epoch's rows are its documents, cut into rows
        read = samples.rows(epoch * samples.n, samples.n) & ~(START | TRAINED)
        stream = [t for d in order for t in docs[d]]
        assert read.ravel().tolist() == stream[:samples.n * samples.width]
        # Positions restart wherever a document starts, including one cut at a row's start.
        batch = decode(samples.rows(epoch * samples.n, samples.n))
        assert (batch.positions[:, 0] == 0).all() and batch.labels.ne(IGNORE_INDEX).any()


def test_a_resumed_reader_sees_the_order_an_uninterrupted_one_sees(tmp_path):
    straight, _ = _shuffled(tmp_path, seed=3)
    whole = straight.rows(0, 3 * straight.n)
    resumed = []  # new readers (a restarted worker) at a checkpoint's position, mid-epoch
    for start, stop in ((0, 5), (5, straight.n + 2), (straight.n + 2, 3 * straight.n)):
        again, _ = _shuffled(tmp_path / f"r{start}", seed=3)
        resumed.append(again.rows(start, stop - start))
    assert np.array_equal(np.concatenate(resumed), whole)
