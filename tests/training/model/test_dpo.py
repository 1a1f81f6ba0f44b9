"""DPO's loss and reference: TRL's DPOTrainer on the same pairs gives the same loss; the first
step's loss is ln 2 with zero rewards (the policy is the reference); reward accuracy rises on a
tiny preference set, full fine-tuning and LoRA; a resume reads the reference back. Real FSDP2
on one gloo rank, the job's cache, sampler and training step."""

from __future__ import annotations

import copy
import json
import math
import random

import numpy as np
import pyarrow.fs as pafs
import pytest
import torch

from tests.training.inproc import run_ranks
from training.config import TrainConfig
from training.data import DataError
from training.data.packing import decode, row_of
from training.data.preference import PairCache, PairSamples
from training.data.source import Source
from training.data.tokenize import BYTES_VOCAB, ByteEncoder
from training.model.dpo import DpoObjective, answer_logps, sigmoid_loss, token_logps
from training.model.model import CausalLMWithLoss, build_model, model_config
from training.run import reference_logps
from training.step.engine import build_engine, train_step
from training.step.schedule import Schedule

CFG = TrainConfig(model="tiny", seq_len=64, micro_batch_size=8, lr=3e-3, warmup_steps=2,
                  steps=20, seed=0, objective="dpo", data="pairs.jsonl")


def pairs_file(path, n: int = 48) -> str:
    """Sums: the chosen answer is right, the rejected one is off; half as strings, half as
    conversations with an implicit prompt."""
    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(n):
            a, b = rng.randint(1, 49), rng.randint(1, 49)
            q, right, wrong = f"{a}+{b}=", str(a + b), str(a + b + rng.randint(1, 9))
            if i % 2:
                row = {"prompt": q, "chosen": right, "rejected": wrong}
            else:
                row = {k: [{"role": "user", "content": q}, {"role": "assistant", "content": v}]
                       for k, v in (("chosen", right), ("rejected", wrong))}
            f.write(json.dumps(row) + "\n")
    return str(path)


def _train(data: str, directory: str, lora_rank: int, steps: int) -> dict:
    cfg = TrainConfig(**{**CFG.to_dict(), "lora_rank": lora_rank, "steps": steps,
                         "lr": 3e-3 if lora_rank == 0 else 1e-2})
    fs = pafs.LocalFileSystem()
    PairCache(fs, directory, "x").build(Source.open(data), ByteEncoder(), cfg.seq_len)
    engine = build_engine(cfg, model_config("tiny", BYTES_VOCAB), torch.device("cpu"))
    engine.objective = DpoObjective(cfg.dpo_beta)
    ref = None if lora_rank else reference_logps.reference_table(
        engine, fs, directory, "tokens.u32", "samples", cfg, 8, 0, 1, fresh=True)
    samples = PairSamples(fs, directory, seed=0, ref=ref)
    schedule, out = Schedule.from_config(cfg), []
    for step in range(1, steps + 1):
        batch = samples.batch((step - 1) * 8, rank=0, world=1, micro=0, batch=8)
        loss = float(train_step(engine, [batch], schedule.lr(step), cfg.grad_clip))
        out.append({"loss": loss, **engine.objective.stats.means()})
        engine.objective.stats = type(engine.objective.stats)()
    return {"steps": out, "ref": ref}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("dpo")
    data = pairs_file(d / "pairs.jsonl")
    return {rank: run_ranks(1, _train, data, str(d / f"r{rank}"), rank, CFG.steps)[0]
            for rank in (0, 8)}


@pytest.mark.parametrize("rank", [0, 8])
def test_the_first_step_is_ln2_with_zero_rewards(trained, rank):
    first = trained[rank]["steps"][0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-5)
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert first[name] == pytest.approx(0.0, abs=1e-5), (name, first)


@pytest.mark.parametrize("rank", [0, 8])
def test_reward_accuracy_rises_and_the_margin_turns_positive(trained, rank):
    last = trained[rank]["steps"][-3:]
    accuracy = sum(s["rewards/accuracies"] for s in last) / 3
    margin = sum(s["rewards/margins"] for s in last) / 3
    assert accuracy > 0.5 and margin > 0, last
    assert trained[rank]["steps"][-1]["loss"] < math.log(2), trained[rank]["steps"][-1]


def test_chosen_and_rejected_in_one_row_never_attend_to_each_other():
    """A pair's answer log-probabilities packed in one row after another pair equal those of
    each sequence alone."""
    torch.manual_seed(0)
    lm = CausalLMWithLoss(build_model("tiny", model_config("tiny", BYTES_VOCAB), seed=0), 16)
    enc = ByteEncoder()
    pair = (enc.prompt_completion("1+2=", "3"), enc.prompt_completion("1+2=", "4 or so"))
    other = (enc.prompt_completion("9+9=", "18"), enc.prompt_completion("9+9=", "81"))
    packed = decode(row_of([other, pair], 60)[None])
    together = answer_logps(lm, packed.inputs, packed.labels, packed.positions, 2)[0, 1]
    alone = []
    for seq in pair:
        b = decode(row_of([(seq, seq)], 2 * len(seq[0]))[None])
        alone.append(answer_logps(lm, b.inputs, b.labels, b.positions)[0, 0, 0])
    torch.testing.assert_close(together, torch.stack(alone), rtol=0, atol=1e-5)


def test_a_resume_reads_the_stored_reference_and_never_recomputes_it(tmp_path):
    data = pairs_file(tmp_path / "pairs.jsonl", 12)
    table = run_ranks(1, _resume_table, data, str(tmp_path / "c"))[0]
    assert table["fresh"].shape == (6, 2, 2)  # 12 pairs, at most two a row of 129 tokens
    np.testing.assert_array_equal(table["resumed"], table["fresh"])
    assert not np.allclose(table["moved"], table["fresh"], atol=1e-3)
    assert "cannot recompute" in table["missing"]


def _resume_table(data: str, directory: str) -> dict:
    fs = pafs.LocalFileSystem()
    PairCache(fs, directory, "x").build(Source.open(data), ByteEncoder(), CFG.seq_len)
    engine = build_engine(CFG, model_config("tiny", BYTES_VOCAB), torch.device("cpu"))
    args = (engine, fs, directory, "tokens.u32", "samples")
    fresh = reference_logps.reference_table(*args, CFG, 4, 0, 1, fresh=True)
    with torch.no_grad():  # the weights move, as training moves them
        for p in engine.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    moved = reference_logps.compute(engine, PairSamples(fs, directory), 4, 0, 1)
    resumed = reference_logps.reference_table(*args, CFG, 4, 0, 1, fresh=False)
    other = TrainConfig(**{**CFG.to_dict(), "seed": 1})
    try:
        reference_logps.reference_table(*args, other, 4, 0, 1, fresh=False)
        missing = ""
    except DataError as e:
        missing = str(e)
    return {"fresh": fresh, "moved": moved, "resumed": resumed, "missing": missing}


def test_the_loss_on_a_fixed_batch_equals_trl_dpotrainer(tmp_path, tokenizer_dir):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = model_config("tiny", len(tok))
    ref = build_model("tiny", config, seed=0)
    policy = copy.deepcopy(ref)
    with torch.no_grad():  # the policy has moved away from the reference
        for p in policy.parameters():
            p.add_(0.02 * torch.randn_like(p, generator=torch.Generator().manual_seed(1)))
    examples = [{"prompt": "the cat", "chosen": " sat on the mat", "rejected": " ran"},
                {"prompt": "a dog and", "chosen": " a bird", "rejected": " the long river bank"},
                {"prompt": "one", "chosen": " two three", "rejected": " four"}]
    enc = [{"prompt_ids": tok.encode(e["prompt"]),
            "chosen_ids": tok.encode(e["chosen"]) + [tok.eos_token_id],
            "rejected_ids": tok.encode(e["rejected"]) + [tok.eos_token_id]} for e in examples]
    args = DPOConfig(output_dir=str(tmp_path), beta=0.1, report_to=[], use_cpu=True,
                     bf16=False)
    trainer = DPOTrainer(model=policy, ref_model=ref, args=args, processing_class=tok,
                         train_dataset=Dataset.from_list(examples))
    inputs = DataCollatorForPreference(pad_token_id=tok.eos_token_id)(enc)
    trl_loss = trainer._compute_loss(trainer.model, inputs, return_outputs=False)

    def ours(model):
        rows = np.stack([row_of([((e["prompt_ids"] + e["chosen_ids"],
                                  [False] * len(e["prompt_ids"]) + [True] * len(e["chosen_ids"])),
                                 (e["prompt_ids"] + e["rejected_ids"],
                                  [False] * len(e["prompt_ids"]) + [True] * len(e["rejected_ids"])))],
                                48) for e in enc])
        b = decode(rows)
        return answer_logps(CausalLMWithLoss(model, 7), b.inputs, b.labels, b.positions)

    with torch.no_grad():
        losses, _, _ = sigmoid_loss(ours(policy), ours(ref), 0.1)
    assert float(losses.mean()) == pytest.approx(float(trl_loss), abs=1e-5)
    assert abs(float(trl_loss) - math.log(2)) > 1e-3  # a batch where the two models differ


@pytest.mark.parametrize("chunk", [3, 0])
def test_the_chunked_log_probs_have_autograds_gradients(chunk):
    """Forward and backward of the chunked log-probabilities against full logits' autograd."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 8, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    labels[0, 1] = labels[1, 4] = -100
    upstream = torch.randn(2, 5, generator=g, dtype=torch.float64)
    ours = token_logps(h, w, labels, chunk)
    grads = torch.autograd.grad((ours * upstream).sum(), (h, w))
    full = torch.log_softmax(h @ w.t(), -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    full = full * (labels != -100)
    expected = torch.autograd.grad((full * upstream).sum(), (h, w))
    torch.testing.assert_close(ours.double(), full, rtol=0, atol=1e-6)
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a.double(), b, rtol=1e-6, atol=1e-6)


def _with_dropout(data: str, directory: str) -> dict:
    """LoRA with --lora-dropout 0.3 and a full model with attention dropout 0.1: the preference
    evaluation, the stored reference and the LoRA reference, each twice, and in eval mode."""
    fs = pafs.LocalFileSystem()
    PairCache(fs, directory, "x").build(Source.open(data), ByteEncoder(), CFG.seq_len)
    samples = PairSamples(fs, directory)
    out = {}
    for rank in (0, 4):
        cfg = TrainConfig(**{**CFG.to_dict(), "lora_rank": rank, "lora_dropout": 0.3 * bool(rank)})
        engine = build_engine(cfg, model_config("tiny", BYTES_VOCAB), torch.device("cpu"))
        for m in engine.model.modules():
            if hasattr(m, "attention_dropout"):
                m.attention_dropout = 0.1
        evaluator = reference_logps.PreferenceEvaluator(
            samples.strided(rank=0, world=1, batch=4), 0, 1, cfg.dpo_beta)
        if rank:
            objective, batch = DpoObjective(cfg.dpo_beta), samples.batch_of([0, 1, 2, 3])
            values = [objective.reference(engine.model, batch) for _ in range(2)]
        else:
            values = [reference_logps.compute(engine, samples, 4, 0, 1) for _ in range(2)]
        values += [evaluator.loss(engine), evaluator.loss(engine)]
        trains = engine.model.training
        engine.model.eval()
        values.append(evaluator.loss(engine))
        out[rank] = {"values": values, "trains_after": trains}
    return out


def test_evaluation_and_references_run_without_dropout_and_training_resumes(tmp_path):
    data = pairs_file(tmp_path / "pairs.jsonl", 8)
    out = run_ranks(1, _with_dropout, data, str(tmp_path / "c"))[0]
    for rank, r in out.items():
        first, again, loss, loss_again, loss_in_eval = r["values"]
        np.testing.assert_array_equal(np.asarray(first), np.asarray(again))
        assert loss == loss_again == loss_in_eval and r["trains_after"], rank
