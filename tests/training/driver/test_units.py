"""Pure pieces of the training package: loss, FLOPs, data, CLI parsing (the schedule:
test_schedule.py; the memory rule and the batch planner: test_planning.py)."""

from __future__ import annotations

import pytest
import torch

from training.driver import cli
from training.config import ConfigError
from training.data.random_tokens import random_batch
from training.model.loss import fused_linear_cross_entropy
from training.step.metrics import merge_csv, mfu, peak_flops
from training.model.model import build_model, count_params, model_config


@pytest.mark.parametrize("chunk,compiled", [(1, False), (7, False), (64, False), (1000, False),
                                            (16, True)])
def test_fused_loss_matches_full_logits_loss_and_gradients(chunk, compiled):
    torch.manual_seed(0)
    n, h, v = 50, 16, 97
    hidden = torch.randn(n, h, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, v, (n,))
    ref = torch.nn.functional.cross_entropy(hidden @ weight.t(), labels)
    ref.backward(torch.tensor(2.0, dtype=torch.float64))
    ref_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ours = fused_linear_cross_entropy(hidden, weight, labels, chunk, compiled)
    ours.backward(torch.tensor(2.0, dtype=torch.float64))
    assert torch.allclose(ours, ref)
    assert torch.allclose(hidden.grad, ref_grads[0]) and torch.allclose(weight.grad, ref_grads[1])


def test_fused_loss_leaves_out_ignored_labels_like_cross_entropy():
    torch.manual_seed(0)
    hidden = torch.randn(40, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(31, 8, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 31, (40,))
    labels[::3] = -100  # e.g. padding, or a prompt not to train on
    ref = torch.nn.functional.cross_entropy(hidden @ weight.t(), labels)
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    ours = fused_linear_cross_entropy(hidden, weight, labels, 7)
    grads = torch.autograd.grad(ours, (hidden, weight))
    assert torch.allclose(ours, ref)
    assert all(torch.allclose(a, b) for a, b in zip(grads, ref_grads))


def test_qwen_shape_param_count_and_flops_per_token():
    config = model_config("qwen2.5-1.5b")
    with torch.device("meta"):
        n = count_params(build_model("qwen2.5-1.5b", config, seed=0, device=torch.device("meta")))
    assert n == 1_543_714_304  # Qwen2.5-1.5B, tied LM head counted once
    # The datasheets' dense bf16 peaks (H200 SXM, L4), and no MFU rather than a made-up one on CPU.
    assert peak_flops("NVIDIA H200") == 989e12 and peak_flops("NVIDIA L4") == 121e12
    assert mfu(10_000, 1e9, peak_flops(None)) is None


@pytest.mark.parametrize("tied", [True, False])
def test_flops_per_token_matches_what_torch_counts_in_a_training_step(tied):
    """torch's own FLOP counter over one forward and backward of the tiny shape (eager attention,
    so the S x S matmuls are counted too) agrees with the 6N + 12LHS formula MFU is built on: N
    without the input embedding of an untied model (a lookup), with a tied head's matrix."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    from training.step.metrics import model_flops_per_token

    config, seq = model_config("tiny"), 256
    config.tie_word_embeddings = tied
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    ids = torch.randint(0, config.vocab_size, (1, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, use_cache=False).logits.float().pow(2).mean().backward()
    per_token = model_flops_per_token(config, count_params(model), seq)
    assert per_token == pytest.approx(counter.get_total_flops() / seq, rel=0.01)


def test_random_batches_are_deterministic_per_rank_and_step():
    kw = dict(seed=0, micro=0, batch=2, seq_len=8, vocab=50, repeat=False)
    a = random_batch(rank=0, step=3, **kw)
    assert torch.equal(a[0], random_batch(rank=0, step=3, **kw)[0])
    assert not torch.equal(a[0], random_batch(rank=1, step=3, **kw)[0])
    assert not torch.equal(a[0], random_batch(rank=0, step=4, **kw)[0])
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])  # labels are the next tokens
    rep = dict(kw, repeat=True)
    assert torch.equal(random_batch(rank=0, step=1, **rep)[0], random_batch(rank=0, step=9, **rep)[0])


def test_metrics_csv_merges_resumed_steps():
    first = merge_csv("", [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}])
    merged = merge_csv(first, [{"step": 2, "loss": 1.4}, {"step": 3, "loss": 1.2}])
    assert [line.split(",")[:2] for line in merged.strip().splitlines()[1:]] == [
        ["1", "2.0"], ["2", "1.4"], ["3", "1.2"]]


def test_cli_reports_every_bad_flag_at_once():
    with pytest.raises(ConfigError) as e:
        cli.parse(["--steps", "0", "--micro-batch-size", "-2", "--lr", "0", "--name", "a/b"])
    text = str(e.value)
    for flag in ("--steps", "--micro-batch-size", "--lr", "--name"):
        assert flag in text


@pytest.mark.parametrize("flags, message", [
    (["--data", "d.jsonl", "--eval-fraction", "1"], "--eval-fraction must be at least 0 and"),
    (["--data", "d.jsonl", "--eval-every", "-1"], "--eval-every must be 0 or more"),
    (["--data", "d.jsonl", "--eval-fraction", "0.1", "--eval-data", "e.jsonl"],
     "--eval-fraction and --eval-data both set"),
    (["--data", "random", "--eval-fraction", "0.1"], "--eval-fraction/--eval-data need --data"),
    (["--data", "d.jsonl", "--epochs", "2", "--steps", "3"], "--steps and --epochs both set"),
    (["--data", "d.jsonl", "--epochs", "0"], "--epochs must be positive"),
    (["--data", "repeat", "--epochs", "1"], "random tokens have no epochs: use --steps"),
])
def test_evaluation_settings_are_validated_naming_the_flag(flags, message):
    with pytest.raises(ConfigError, match=message):
        cli.parse(flags)


def test_local_flag_is_the_laptop_default_and_other_flags_still_apply():
    cfg = cli.parse(["--local", "--steps", "7"])
    assert (cfg.model, cfg.num_workers, cfg.use_gpu, cfg.address, cfg.steps) == (
        "tiny", 2, False, None, 7)


def test_relative_model_and_tokenizer_directories_become_absolute_once(tmp_path, monkeypatch):
    from training.driver.checks import absolute_paths

    (tmp_path / "runs/exp/hf_model").mkdir(parents=True)
    (tmp_path / "tok").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = absolute_paths(cli.parse(["--model", "runs/exp/hf_model", "--tokenizer", "tok"]))
    assert (cfg.model, cfg.tokenizer) == (str(tmp_path / "runs/exp/hf_model"),
                                          str(tmp_path / "tok"))
    # Hub ids, S3 directories, built-in names and `bytes` are not local directories here.
    for model, tokenizer in (("Qwen/Qwen2.5-1.5B", "bytes"), ("s3://b/m/", None), ("tiny", None)):
        cfg = absolute_paths(cli.parse(["--model", model] + (["--tokenizer", tokenizer]
                                                             if tokenizer else [])))
        assert (cfg.model, cfg.tokenizer) == (model, tokenizer)
