"""CPU rehearsal of the preemption-checkpoint benchmark (device-run.sh preempt): one rank's shards
of a run of 8 workers, written and copied, timed, in JSON."""

from __future__ import annotations

import json
import math

import torch
from transformers import AutoModelForCausalLM

from bench import emergency_save
from training.model.model import model_config


def test_one_ranks_shards_are_written_and_copied_and_timed(tmp_path):
    out = tmp_path / "emergency.json"
    (tmp_path / "local").mkdir()
    assert emergency_save.main(["--model", "tiny", "--world", "8", "--repeats", "1",
                                "--local-dirs", f"{tmp_path / 'local'},{tmp_path / 'absent'}",
                                "--storage-path", str(tmp_path / "storage"),
                                "--json-out", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]  # an absent directory is skipped
    with torch.device("meta"):
        params = list(AutoModelForCausalLM.from_config(model_config("tiny")).parameters())
    # fp32 rows ceil(n / 8) of every parameter and of AdamW's two moments (and its step), plus
    # DCP's framing of each of these tensors and its metadata: a few KiB each.
    shard_bytes = sum(3 * 4 * math.ceil(p.shape[0] / 8) * p[0].numel() for p in params)
    assert shard_bytes <= run["gib"] * 2**30 < shard_bytes + 4 * len(params) * 4096
    assert run["write_s"] > 0 and run["upload_s"] > 0 and run["local_dir"] == str(
        tmp_path / "local")
    assert not list((tmp_path / "local").iterdir())  # nothing left behind
