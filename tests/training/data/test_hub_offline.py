"""An unreachable Hub: one error line after one short TCP probe (never huggingface_hub's retries
with backoff), and HF_HUB_OFFLINE honoured without a probe."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.conftest import REPO
from tests.ports import free_port
from training.data import hub


def test_the_readmes_preview_with_the_hub_unreachable_is_one_line(tmp_path):
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}",  # nothing listens
           "HF_HOME": str(tmp_path / "hf")}  # an empty cache
    env.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run([sys.executable, "-m", "training", "--preview", "3", "--data",
                           "hf://trl-lib/Capybara", "--tokenizer", "Qwen/Qwen2.5-1.5B"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no "Retrying in 4s [Retry 3/5]" lines
    assert lines[0].startswith("error: --data 'hf://trl-lib/Capybara': cannot fetch it")
    assert "is unreachable" in lines[0] and "the local cache has no copy" in lines[0]


def test_hf_hub_offline_reads_the_cache_without_a_probe(monkeypatch):
    from huggingface_hub import constants

    def no_probe(*_args, **_kwargs):
        raise AssertionError("probed the Hub under HF_HUB_OFFLINE")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(socket, "create_connection", no_probe)
    hub.offline_unless_reachable(["hf://trl-lib/Capybara", "Qwen/Qwen2.5-1.5B"])


def test_local_names_need_no_hub(monkeypatch, tmp_path):
    from huggingface_hub import constants

    def no_probe(*_args, **_kwargs):
        raise AssertionError("probed the Hub for local names")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "create_connection", no_probe)
    (tmp_path / "org").mkdir()
    (tmp_path / "org/tok").mkdir()
    monkeypatch.chdir(tmp_path)
    hub.offline_unless_reachable(["bytes", "tiny", "org/tok", "data.jsonl", None])
