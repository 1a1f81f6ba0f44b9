"""DPO end to end against TRL 1.16.0's DPOTrainer, TRL tokenizing the same rows itself: for each
preference format (strings and messages, explicit and implicit prompt), the tokens that train,
the loss, the rewards and the policy's log-probabilities, our pairs packed together in one row.
One pinned difference: a chat answer's trained tokens stop at the end-of-turn token, where TRL
also trains the template's "\n" after it (training/data/tokenize.py: generation stops at
`<|im_end|>`, the newline is never generated): trained as TRL does, that token alone makes the
difference, and the test prints its size (docs/dpo.md quotes it: `pytest -rP`)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from training.data.packing import decode, row_of
from training.data.preference import encode_pair
from training.model.dpo import answer_logps, sigmoid_loss
from training.model.model import CausalLMWithLoss, build_model, model_config

USER = [{"role": "user", "content": "Name a colour of the sky."}]


def _said(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


FORMATS = {
    "strings": [{"prompt": "The sky is", "chosen": " blue today", "rejected": " green"},
                {"prompt": "One and one make", "chosen": " two", "rejected": " eleven or so"}],
    "strings, implicit": [{"chosen": "The sky is blue today", "rejected": "The sky is green"},
                          {"chosen": "One and one make two", "rejected": "One and one make ten"}],
    "messages": [{"prompt": USER, "chosen": _said("Blue."), "rejected": _said("Green, I think.")},
                 {"prompt": USER, "chosen": _said("Grey at dusk."), "rejected": _said("Red.")}],
    "messages, implicit": [{"chosen": USER + _said("Blue."), "rejected": USER + _said("Red.")},
                           {"chosen": USER + _said("A deep blue."), "rejected": USER + _said("No.")}],
}


def _trl(tok, policy, ref, rows, tmp_path):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    args = DPOConfig(output_dir=str(tmp_path), beta=0.1, report_to=[], use_cpu=True, bf16=False)
    trainer = DPOTrainer(model=policy, ref_model=ref, args=args, processing_class=tok,
                         train_dataset=Dataset.from_list(rows))
    examples = [{k: trainer.train_dataset[i][k] for k in ("prompt_ids", "chosen_ids",
                                                          "rejected_ids")}
                for i in range(len(rows))]

    def loss(examples):
        inputs = DataCollatorForPreference(pad_token_id=tok.pad_token_id)(examples)
        trainer._metrics["train"].clear()
        with torch.no_grad():
            value = float(trainer._compute_loss(trainer.model, inputs, return_outputs=False))
        return value, {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return examples, loss


def _ours(policy, ref, pairs):
    b = decode(row_of(pairs, 400)[None])  # every pair packed in one row
    logps = [answer_logps(CausalLMWithLoss(m, 13), b.inputs, b.labels, b.positions,
                          len(pairs))[0] for m in (policy, ref)]
    losses, chosen, rejected = sigmoid_loss(*logps, 0.1)
    return float(losses.mean()), float(chosen.mean()), float(rejected.mean()), logps[0]


@pytest.mark.parametrize("name", list(FORMATS))
def test_dpo_equals_trls_dpotrainer_on_every_preference_format(name, qwen_template_tokenizer,
                                                                 tmp_path):
    from transformers import AutoTokenizer

    from training.data.tokenize import HFEncoder

    tok = AutoTokenizer.from_pretrained(qwen_template_tokenizer)
    enc = HFEncoder(str(qwen_template_tokenizer))
    ref = build_model("tiny", model_config("tiny", len(tok)), seed=0)
    policy = copy.deepcopy(ref)
    with torch.no_grad():  # the policy has moved away from the reference
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p, generator=torch.Generator().manual_seed(1)))
    rows = FORMATS[name]
    examples, trl_loss = _trl(tok, policy, ref, rows, tmp_path)
    pairs = [encode_pair(r, enc) for r in rows]
    newline = tok.encode("\n", add_special_tokens=False)
    for e, pair in zip(examples, pairs):
        for side, (ids, trained) in zip(("chosen_ids", "rejected_ids"), pair):
            assert ids == e["prompt_ids"] + e[side]  # the same tokens
            mask = [False] * len(e["prompt_ids"]) + [True] * len(e[side])
            if name.startswith("messages"):  # the pinned difference: TRL's "\n" after <|im_end|>
                assert ids[-len(newline):] == newline
                mask[-len(newline):] = [False] * len(newline)
            assert trained == mask
    loss, chosen, rejected, logps = _ours(policy, ref, pairs)
    same = [{**e, **{s: e[s][:-len(newline)] for s in ("chosen_ids", "rejected_ids")}}
            for e in examples] if name.startswith("messages") else examples
    expected, metrics = trl_loss(same)
    assert loss == pytest.approx(expected, abs=1e-5)
    assert chosen == pytest.approx(metrics["rewards/chosen"], abs=1e-5)
    assert rejected == pytest.approx(metrics["rewards/rejected"], abs=1e-5)
    assert float(logps[:, 0].mean()) == pytest.approx(metrics["logps/chosen"], abs=1e-4)
    assert float(logps[:, 1].mean()) == pytest.approx(metrics["logps/rejected"], abs=1e-4)
    assert abs(expected - np.log(2)) > 1e-3  # the two models differ on these pairs
    if name.startswith("messages"):  # TRL's own loss trains the "\n" too: that token alone
        trl_own, trl_metrics = trl_loss(examples)
        with_newline = [tuple((ids, [*trained[:-len(newline)], *[True] * len(newline)])
                              for ids, trained in pair) for pair in pairs]
        assert _ours(policy, ref, with_newline)[0] == pytest.approx(trl_own, abs=1e-5)
        assert trl_own != pytest.approx(loss, abs=1e-6)
        print(f"{name}: TRL's loss with the newline {trl_own:.5f}, ours {loss:.5f} "
              f"({trl_own - loss:+.5f}); policy log-prob of chosen "
              f"{trl_metrics['logps/chosen']:.3f} against {float(logps[:, 0].mean()):.3f}, "
              f"rejected {trl_metrics['logps/rejected']:.3f} against "
              f"{float(logps[:, 1].mean()):.3f}")
