"""The real job on a local Ray with real torch (gloo on CPU): learning, resume, faults, data, S3."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from training import cli
from training.config import ConfigError, TrainConfig
from training.engine import lr_at

pytestmark = pytest.mark.usefixtures("ray_session")


def run(tmp_path, *flags: str) -> dict:
    return cli.run(cli.parse(["--local", "--storage-path", str(tmp_path / "runs"), *flags]))


def read_metrics(tmp_path, name="qwen-fsdp") -> list[dict]:
    with open(tmp_path / "runs" / name / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_loss_halves_on_a_repeated_batch(tmp_path, monkeypatch):
    started = tmp_path / "run-started-at"  # as the run's Ray head records it, 100 s ago
    started.write_text(str(int(time.time()) - 100))
    monkeypatch.setenv(cli.RUN_STARTED_ENV, str(started))
    s = run(tmp_path, "--data", "repeat", "--steps", "30", "--lr", "1e-2", "--seq-len", "64",
            "--log-every", "10")
    assert s["steps"] == 30 and s["world_size"] == 2
    assert s["last_loss"] < 0.5 * s["first_loss"], s
    # Time to first step counts from the run's start, and the workers' wait is part of it.
    assert 100 <= s["waited_for_workers_s"] < s["time_to_first_step_s"], s
    assert (tmp_path / "runs/qwen-fsdp/metrics.png").stat().st_size > 0


def test_rerun_resumes_and_continues_steps_and_schedule_skipping_torn_saves(tmp_path):
    first = run(tmp_path, "--steps", "4", "--checkpoint-every", "2", "--log-every", "1")
    assert first["resumed_from_step"] is None and first["checkpoint"].endswith("step0000004")
    # A later save killed mid-upload: files on storage, but never registered by Ray Train.
    torn = tmp_path / "runs/qwen-fsdp/checkpoint-step0000005"
    torn.mkdir()
    (torn / "__0_0.distcp").write_bytes(b"partial")
    second = run(tmp_path, "--steps", "8", "--checkpoint-every", "2", "--log-every", "1")
    assert second["resumed_from_step"] == 4 and second["steps"] == 8
    rows = read_metrics(tmp_path)
    assert [int(r["step"]) for r in rows] == list(range(1, 9))
    cfg8 = TrainConfig(steps=8)
    assert float(rows[4]["lr"]) == pytest.approx(lr_at(5, cfg8))  # not a restarted warmup
    assert float(rows[4]["lr"]) != pytest.approx(lr_at(1, cfg8))


def test_worker_death_recovers_from_last_checkpoint(tmp_path):
    s = run(tmp_path, "--steps", "5", "--checkpoint-every", "2", "--max-failures", "1",
            "--fault-at-step", "3", "--log-every", "1")
    assert s["steps"] == 5 and s["resumed_from_step"] == 2


def test_trains_on_shipped_text_exports_and_continues_from_the_export(tmp_path, tokenizer_dir):
    text = ["--data", str(REPO / "training/sample_data/tiny_corpus.jsonl"), "--seq-len", "64",
            "--micro-batch-size", "2", "--checkpoint-every", "0"]
    s = run(tmp_path, *text, "--tokenizer", str(tokenizer_dir), "--steps", "12", "--lr", "5e-3",
            "--log-every", "4", "--export")
    assert s["steps"] == 12 and s["last_loss"] < s["first_loss"]
    exported = tmp_path / "runs/qwen-fsdp/hf_model"
    (exported / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_dir / name).exists():
            (exported / name).write_bytes((tokenizer_dir / name).read_bytes())
    # A local Hugging Face directory as --model: from_pretrained loads the trained weights.
    again = run(tmp_path, *text, "--model", str(exported), "--steps", "2", "--name", "continued")
    assert again["first_loss"] < s["first_loss"] - 0.5, (s, again)


def test_checkpoints_to_s3_and_resumes_from_it(tmp_path, s3_server):
    flags = ["--local", "--storage-path", "s3://ckpt/runs", "--checkpoint-every", "2"]
    first = cli.run(cli.parse([*flags, "--steps", "2"]))
    assert first["checkpoint"] == "s3://ckpt/runs/qwen-fsdp/checkpoint-step0000002"
    keys = [o["Key"] for o in s3_server.list_objects_v2(Bucket="ckpt")["Contents"]]
    assert "runs/qwen-fsdp/checkpoint-step0000002/.metadata" in keys
    assert "runs/qwen-fsdp/metrics.csv" in keys
    second = cli.run(cli.parse([*flags, "--steps", "4"]))
    assert second["resumed_from_step"] == 2 and second["steps"] == 4


@pytest.mark.parametrize("flags, message", [
    (["--model", "/no/such/model"], "no such model directory"),
    (["--seq-len", "4096"], "beyond the model's 1024 positions"),
    (["--num-workers", "64"], "needs 64 CPUs"),
    (["--storage-path", "/proc/forbidden/runs"], "not writable"),
    (["--data", "/no/such/file.jsonl", "--tokenizer", "x"], "no such file"),
])
def test_bad_input_fails_fast_with_a_clear_message(tmp_path, flags, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        run(tmp_path, *flags)
    assert not (tmp_path / "runs" / "qwen-fsdp").exists()


def test_empty_dataset_is_rejected_before_training(tmp_path, tokenizer_dir):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"text": ""}) + "\n")
    with pytest.raises(ValueError, match="holds no text"):
        run(tmp_path, "--data", str(empty), "--tokenizer", str(tokenizer_dir))


def test_local_quick_start_command_under_two_minutes(tmp_path):
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "training", "--local", "--storage-path",
                           str(tmp_path / "runs")], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    elapsed = time.time() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 30 and summary["resumed_from_step"] is None
    assert summary["nccl_transport"] == "not-used"  # gloo: says so rather than guessing
    # What the defaults resolved to on CPU: eager, ZeRO-3, no activation checkpointing.
    assert (summary["compile"], summary["reshard_after_forward"],
            summary["activation_checkpointing"]) == (False, True, False)
    assert "PlacementGroupCleaner" not in proc.stdout + proc.stderr
    assert elapsed < 120, f"--local took {elapsed:.0f}s"


def test_cli_bad_flag_exits_2_with_one_error_line():
    proc = subprocess.run([sys.executable, "-m", "training", "--steps", "0", "--lr", "-1"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "--steps must be at least 1" in proc.stderr and "--lr must be positive" in proc.stderr
    assert "Traceback" not in proc.stderr
