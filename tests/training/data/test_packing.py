"""Packed documents do not attend to each other: a document's logits inside a packed row equal
its logits alone, through the call the training step makes (CausalLMWithLoss)."""

from __future__ import annotations

import torch

from training.data.packing import Batch
from training.model.loss import IGNORE_INDEX
from training.model.model import CausalLMWithLoss, build_model, model_config

LENGTHS = (5, 9, 7)  # three documents in one packed row


def _model() -> CausalLMWithLoss:
    config = model_config("tiny")
    config.use_cache = True  # the Hugging Face default, which would keep attention causal
    return CausalLMWithLoss(build_model("tiny", config, seed=0), loss_chunk_tokens=8).eval()


def _docs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 512, (1, n + 1), generator=g) for n in LENGTHS]


def test_a_documents_logits_in_a_packed_row_equal_the_document_alone():
    model, docs = _model(), _docs()
    row = torch.cat([d[:, :-1] for d in docs], dim=1)
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    with torch.no_grad():
        packed = model.lm.lm_head(model.hidden(row, positions))
        start = 0
        for doc, n in zip(docs, LENGTHS):
            alone = model.lm.lm_head(model.hidden(doc[:, :-1], None))
            torch.testing.assert_close(packed[:, start:start + n], alone, rtol=1e-4, atol=1e-4)
            start += n
        # Without the per-document positions the later documents see the earlier ones.
        causal = model.lm.lm_head(model.hidden(row, None))
        assert (causal[:, LENGTHS[0]:] - packed[:, LENGTHS[0]:]).abs().max() > 1e-2


def test_a_documents_loss_in_a_packed_row_equals_its_loss_alone():
    model, docs = _model(), _docs()
    row = torch.cat([d[:, :-1] for d in docs], dim=1)
    labels = torch.full_like(row, IGNORE_INDEX)
    middle = slice(LENGTHS[0], LENGTHS[0] + LENGTHS[1])
    labels[:, middle] = docs[1][:, 1:]
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    with torch.no_grad():
        packed = model(*Batch(row, labels, positions))
        alone = model(docs[1][:, :-1], docs[1][:, 1:])
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
