"""Text data that resumes exactly: one fixed order of packed samples, positions by count."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.fs as pafs
import pytest

from training.data.cache import INDEX_FILE, TOKENS_FILE, TokenCache
from training.data.packing import Samples, sample_start
from training.data.tokenize import BYTES, tokenize


def _consumed(samples_seen: int, steps: int, world: int, accum: int,
              batch: int) -> tuple[list, int]:
    """Sample indices every rank reads over `steps` optimizer steps, as the loop advances."""
    seen = []
    for _ in range(steps):
        for rank in range(world):
            for micro in range(accum):
                start = sample_start(samples_seen, rank=rank, world=world, micro=micro, batch=batch)
                seen.extend(range(start, start + batch))
        samples_seen += world * accum * batch  # what training/loop.py adds per step
    return seen, samples_seen


def test_every_sample_once_across_ranks_and_a_resume_with_another_world_size_and_batch():
    first, position = _consumed(0, steps=5, world=2, accum=1, batch=2)
    second, end = _consumed(position, steps=4, world=3, accum=2, batch=1)
    assert sorted(first + second) == list(range(end)) and end == 20 + 24


def _write_cache(tmp_path, rows: np.ndarray) -> str:
    d = tmp_path / "tokens-x"
    d.mkdir()
    (d / TOKENS_FILE).write_bytes(rows.astype("<u4").tobytes() + b"\x07\x00\x00\x00")  # + a tail
    (d / INDEX_FILE).write_text(json.dumps({"samples": len(rows), "sample_tokens": rows.shape[1]}))
    return str(d)


def test_samples_are_rows_of_the_file_wrapping_into_the_next_epoch(tmp_path):
    rows = np.arange(15).reshape(5, 3)
    samples = Samples(pafs.LocalFileSystem(), _write_cache(tmp_path, rows))
    assert samples.rows(3, 4).tolist() == rows[[3, 4, 0, 1]].tolist()
    inputs, labels = samples.batch(4, rank=1, world=2, micro=0, batch=2)  # samples 6, 7 = rows 1, 2
    assert inputs.tolist() == rows[[1, 2], :-1].tolist()
    assert labels.tolist() == rows[[1, 2], 1:].tolist()


def test_a_cache_without_its_index_is_refused(tmp_path):
    d = _write_cache(tmp_path, np.zeros((2, 3)))
    (tmp_path / "tokens-x" / INDEX_FILE).unlink()
    with pytest.raises(ValueError, match="incomplete"):
        Samples(pafs.LocalFileSystem(), d)


@pytest.mark.usefixtures("ray_session")
def test_tokenized_once_in_the_files_order_and_reused(tmp_path):
    src = tmp_path / "text"
    src.mkdir()
    docs = {name: [f"{name} document {i} " * (i + 1) for i in range(30)] for name in "bca"}
    for name, texts in docs.items():
        (src / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    expected = tokenize([t for name in sorted(docs) for t in docs[name]], BYTES)
    fs = pafs.LocalFileSystem()
    builds = []
    for run in ("one", "two"):
        cache = TokenCache.for_run(fs, str(tmp_path / run), str(src), BYTES, 15)
        index = cache.build(str(src), BYTES, 15)
        builds.append((tmp_path / run / f"tokens-{cache.fingerprint}" / TOKENS_FILE).read_bytes())
    assert builds[0] == builds[1]  # the same samples in the same order, every time
    packed = np.frombuffer(builds[0], dtype="<u4")
    assert packed.tolist() == expected.tolist() and index["samples"] == len(expected) // 16
    tokens = tmp_path / "two" / f"tokens-{cache.fingerprint}" / TOKENS_FILE
    tokens.write_bytes(b"")  # a rerun reads the existing index and tokenizes nothing again
    assert cache.build(str(src), BYTES, 15) == index and tokens.read_bytes() == b""
