"""Packed documents kept apart (document_mask): a sequence of several documents through
wstrain's model with per-document positions and a block-diagonal causal mask gives the
logits, loss and gradients that transformers gives running each document on its own.

    pytest tests/worker/models/test_documents.py
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.worker.hf_models import hf_causal_lm, hub_grads, hub_state, perturb_norms
from tests.worker.models.reference_dims import CONFIGS
from tests.worker.relative_error import rel_err
from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.models.dense import LlamaModel

# two sequences of 24 tokens: the first holds three documents, the second the tail of a
# document cut by its start and a whole one
LENGTHS = [[7, 10, 7], [5, 19]]


def _documents(lengths: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    pos = [torch.cat([torch.arange(n) for n in row]) for row in lengths]
    seg = [torch.cat([torch.full((n,), i) for i, n in enumerate(row)]) for row in lengths]
    return torch.stack(pos), torch.stack(seg)  # (B, S) each


@pytest.mark.parametrize("dims", CONFIGS[:2], ids=lambda d: d.model_type)
def test_document_masks_equal_each_document_alone_in_transformers(dims: ModelDims) -> None:
    torch.manual_seed(0)
    ref = hf_causal_lm(dims).eval()
    perturb_norms(ref, seed=4)
    ours = LlamaModel(dims)
    ours.load_state_dict(hub_state(ref), strict=True)
    tokens = torch.randint(0, dims.vocab_size, (2, 25))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (2, 24)

    logits = ours(inputs, None, _documents(LENGTHS))  # (2, 24, V)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()

    pieces, ref_loss = [], torch.zeros(())
    for b, row in enumerate(LENGTHS):
        at = 0
        for n in row:  # each document alone: positions from 0, nothing before it
            piece = ref(input_ids=inputs[b : b + 1, at : at + n]).logits[0]  # (n, V)
            pieces.append(piece)
            ref_loss = ref_loss + F.cross_entropy(piece, targets[b, at : at + n], reduction="sum")
            at += n
    ref_logits = torch.cat(pieces).reshape_as(logits)
    (ref_loss / targets.numel()).backward()

    assert rel_err(logits, ref_logits) < 1e-5
    assert loss.item() == pytest.approx(ref_loss.item() / targets.numel(), rel=1e-5)
    ref_grads = hub_grads(ref)
    for name, p in ours.named_parameters():
        assert rel_err(p.grad, ref_grads[name]) < 1e-5, name
    # and without the mask the documents do see each other
    with torch.no_grad():
        assert rel_err(ours(inputs), ref_logits) > 1e-3
