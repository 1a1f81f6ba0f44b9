"""bench.lora's baseline trains the loss ours trains: the same packed rows, the same
per-document attention (its GPU runs are `bash bench/device-run.sh lora-l4`)."""

from __future__ import annotations

import pytest
import torch

from bench import lora as bench_lora
from bench import naive_peft
from training.model.model import CausalLMWithLoss, build_model, model_config


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A micro-batch of the shipped set as bench.lora reads it, rows of several documents."""
    samples = bench_lora._samples(256, str(tmp_path_factory.mktemp("samples")))
    batch = samples.batch(0, rank=0, world=1, micro=0, batch=2)
    assert int((batch.positions == 0).sum()) > 2, "the rows should hold more than one document"
    return batch


def _baseline_losses(packed) -> tuple[torch.Tensor, torch.Tensor]:
    """Each labelled token's loss under the baseline (fp32): per document, and causal."""
    args = bench_lora.build_parser().parse_args(["--model", "tiny", "--large-model", "tiny",
                                                 "--large-seq-len", "256", "--lora-rank", "4"])
    cfg = bench_lora.run_config(args, "naive-large", on_gpu=False)
    lm, _, _ = naive_peft.build(cfg, torch.device("cpu"), dtype=torch.float32)
    return tuple(_token_losses(naive_peft.logits(lm, packed, torch.device("cpu"), causal)
                               .flatten(0, 1), packed.labels) for causal in (False, True))


def _token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    counted = labels.flatten() != -100
    losses = torch.nn.functional.cross_entropy(logits, labels.flatten(), reduction="none")
    return losses[counted].detach()


def test_the_baseline_trains_our_loss_on_packed_rows(packed):
    """At init (LoRA's B is zero) the baseline's loss is our model's on the same rows: the
    same per-document attention. Left causal, its rows attend across documents: another loss."""
    ours = CausalLMWithLoss(build_model("tiny", model_config("tiny"), seed=0), 64)
    with torch.no_grad():
        hidden = ours.hidden(packed.inputs, packed.positions)
        expected = _token_losses(ours.lm.lm_head(hidden).flatten(0, 1), packed.labels)
        mean = float(ours(packed.inputs, packed.labels, packed.positions))  # the fused loss
    assert float(expected.mean()) == pytest.approx(mean, rel=1e-5)
    same, crossing = _baseline_losses(packed)
    assert torch.allclose(same, expected, rtol=0, atol=1e-5)
    assert (crossing - expected).abs().max() > 1e-3


def test_ours_attends_as_the_cluster_job_on_a_gpu_and_the_baseline_with_sdpa():
    args = bench_lora.build_parser().parse_args([])
    assert bench_lora.run_config(args, "lora-large", on_gpu=True).attention == \
        bench_lora.JOB_DEFAULTS["attention"] == "flex_attention"
    assert bench_lora.run_config(args, "lora-large", on_gpu=False).attention == "sdpa"
    assert bench_lora.run_config(args, "naive-large", on_gpu=True).attention == "sdpa"
    explicit = bench_lora.build_parser().parse_args(["--attention", "sdpa"])
    assert bench_lora.run_config(explicit, "lora-large", on_gpu=True).attention == "sdpa"


def test_the_dpo_bench_builds_its_runs_as_bench_lora_does(tmp_path):
    """bench.dpo takes bench.lora's runs (their shapes and attention) and trains a DPO step."""
    import json

    from bench import dpo

    out = tmp_path / "dpo.json"
    assert dpo.main(["--model", "tiny", "--large-model", "tiny", "--large-seq-len", "256",
                     "--steps", "2", "--runs", "lora-large", "--json-out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert "error_text" not in row and row["attention"] == "sdpa" and row["objective"] == "dpo"
    # packed: many shipped pairs a 513-token row, the padding at its end left out of the rate
    assert row["pairs_per_row"] > 4 and 0.5 < row["real_share"] < 1
    assert row["pair_tokens_per_s"] == row["tokens_per_s"] * row["real_share"]
