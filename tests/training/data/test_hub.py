"""`--data hf://...` offline: a Hugging Face hub cache laid out here as huggingface_hub lays it out
(`datasets--org--name/{blobs,refs,snapshots/<commit>}`, snapshot files linked to their blobs),
read through huggingface_hub's own `snapshot_download` with HF_HUB_OFFLINE: which files a config
and split hold, the rows, and an identity that follows the revision."""

from __future__ import annotations

import hashlib
import json
import io
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.data import DataError
from training.data.cache import fingerprint
from training.data.source import Source
from training.data.tokenize import BYTES

MAIN, V2 = "1" * 40, "2" * 40  # two commits of one dataset
CARD = ("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        "    path: data/train-*\n  - split: test\n    path: data/test-*\n"
        "- config_name: short\n  data_files: short/*.jsonl\n---\n# A chat set\n")


def _chat(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"question {i}"},
                         {"role": "assistant", "content": f"answer {i}"}], "source": "test"}


def _parquet(rows: list[dict]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def _commit(repo_dir, commit: str, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo_dir / "snapshots" / commit / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch):
    """`org/chat` at two commits (refs main and v2), and `org/plain` with no card; the Hub
    itself unreachable (huggingface_hub reads both settings at call time)."""
    import huggingface_hub.constants as constants

    cache = tmp_path / "hub"
    chat = cache / "datasets--org--chat"
    _commit(chat, MAIN, {"README.md": CARD.encode(),
                         "data/train-00000-of-00001.parquet": _parquet([_chat(i)
                                                                        for i in range(3)]),
                         "data/test-00000-of-00001.parquet": _parquet([_chat(9)]),
                         "short/a.jsonl": b'{"text": "short one"}\n'})
    _commit(chat, V2, {"README.md": CARD.encode(),
                       "data/train-00000-of-00001.parquet": _parquet([_chat(i) for i in range(4)]),
                       "data/test-00000-of-00001.parquet": _parquet([_chat(9)])})
    (chat / "refs").mkdir()
    (chat / "refs/main").write_text(MAIN)
    (chat / "refs/v2").write_text(V2)
    plain = cache / "datasets--org--plain"
    _commit(plain, MAIN, {"train.jsonl": b'{"text": "a train row"}\n',
                          "eval/part-0.jsonl": b'{"text": "an eval row"}\n',
                          "notes.txt": b"not data"})
    (plain / "refs").mkdir()
    (plain / "refs/main").write_text(MAIN)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def _rows(uri: str) -> list[tuple[str, int, dict]]:
    return list(Source.open(uri).rows())


def test_a_split_of_the_cards_default_config_is_its_data_files(hub_cache):
    rows = _rows("hf://org/chat")
    assert [r["messages"][1]["content"] for _, _, r in rows] == ["answer 0", "answer 1",
                                                               "answer 2"]
    where, number, _ = rows[1]
    assert (where, number) == (f"hf://org/chat@{MAIN[:12]}/data/train-00000-of-00001.parquet", 2)
    assert [r["messages"][1]["content"] for _, _, r in _rows("hf://org/chat:test")] == ["answer 9"]
    assert [r for _, _, r in _rows("hf://org/chat/short")] == [{"text": "short one"}]


def test_without_a_card_the_split_comes_from_file_and_directory_names(hub_cache):
    assert [r["text"] for _, _, r in _rows("hf://org/plain")] == ["a train row"]
    # `eval` is one of datasets' keywords of the test split (data_files.py SPLIT_KEYWORDS).
    assert [r["text"] for _, _, r in _rows("hf://org/plain:test")] == ["an eval row"]


def test_the_identity_is_the_commit_a_revision_resolves_to(hub_cache):
    main = fingerprint(Source.open("hf://org/chat"), BYTES, 8)
    assert fingerprint(Source.open(f"hf://org/chat@{MAIN}"), BYTES, 8) == main  # same commit
    assert fingerprint(Source.open("hf://org/chat@v2"), BYTES, 8) != main
    assert len(_rows("hf://org/chat@v2")) == 4
    assert fingerprint(Source.open("hf://org/chat:test"), BYTES, 8) != main


@pytest.mark.parametrize("uri, message", [
    ("hf://org", "expected hf://org/name with an optional /config"),
    ("hf://org/chat:nope", "config .default. has no split .nope. .splits: train, test"),
    ("hf://org/chat/other", "no config 'other' .configs: default, short"),
    ("hf://org/chat@v9", "cannot fetch it from the Hugging Face Hub .LocalEntryNotFoundError"),
    ("hf://org/missing", "cannot fetch it from the Hugging Face Hub"),
    ("hf://org/plain:validation", "no .jsonl/.json/.parquet files of split 'validation'"),
])
def test_a_split_that_is_not_there_is_refused_naming_it(hub_cache, uri, message):
    with pytest.raises(DataError, match=f"--data '{uri}': {message}"):
        Source.open(uri)


def test_preview_reads_a_hub_split_through_the_job_cli(hub_cache, capsys):
    from training.driver import cli

    assert cli.main(["--preview", "1", "--tokenizer", "bytes", "--data", "hf://org/chat:test"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row == {"text": "<|user|>\nquestion 9\n<|assistant|>\nanswer 9<|endoftext|>",
                   "trained": ["answer 9<|endoftext|>"]}
