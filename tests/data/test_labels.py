"""One convention for unscored labels: IGNORE_LABEL in every label tensor, the pad token only in storage."""

from __future__ import annotations

import itertools

import numpy as np
import torch
import torch.nn.functional as F

from latentloop.data.labels import IGNORE_LABEL, STORED_IGNORE, label_tokens, scored_labels
from latentloop.eval.metrics import answer_exact
from latentloop.models.reasoners import ReasonerConfig, ReasonerOutput, build_reasoner
from latentloop.tasks.base import get_task
from latentloop.train.deep_supervision import supervision_loss
from latentloop.train.puzzle_batches import draw_examples
from latentloop.train.run_config import build_reasoner_config
from tests.tiny import TINY_REASONER

COLORING = get_task("graph-coloring", n=5)


def coloring_split(size: int = 6) -> dict[str, np.ndarray]:
    pairs = list(itertools.islice(COLORING.examples("train", 0), size))
    return {
        "inputs": np.stack([COLORING.encode(p) for p, _ in pairs]).astype(np.uint8),
        "labels": np.stack([COLORING.encode(s) for _, s in pairs]).astype(np.uint8),
        "puzzle_ids": np.zeros(size, dtype=np.int64),
    }


def test_stored_rows_become_label_rows_and_back():
    stored = np.array([[0, 3, 4, 0], [5, 0, 0, 6]], dtype=np.uint8)
    original = stored.copy()
    labels = scored_labels(stored)
    assert labels.dtype == np.int64
    assert labels.tolist() == [[IGNORE_LABEL, 3, 4, IGNORE_LABEL], [5, IGNORE_LABEL, IGNORE_LABEL, 6]]
    assert label_tokens(torch.from_numpy(labels)).tolist() == stored.tolist()
    assert np.array_equal(stored, original)  # the stored rows are left as they were


def test_drawn_batches_mark_exactly_the_stored_pads_unscored():
    split = coloring_split()
    rng = np.random.default_rng(0)
    _, labels, _ = draw_examples(COLORING, split, rng, 4, False)
    rows = np.random.default_rng(0).integers(0, len(split["inputs"]), 4)
    stored = split["labels"][rows]
    assert (stored == STORED_IGNORE).any() and (stored != STORED_IGNORE).any()
    assert torch.equal(labels == IGNORE_LABEL, torch.from_numpy(stored == STORED_IGNORE))
    assert torch.equal(
        labels[labels != IGNORE_LABEL], torch.from_numpy(stored[stored != STORED_IGNORE]).long()
    )


def _output(logits: torch.Tensor) -> ReasonerOutput:
    batch = logits.shape[0]
    zeros = torch.zeros(batch)
    return ReasonerOutput(logits=logits, halt_logit=zeros, value=zeros, kl=zeros, continue_logit=None)


def test_the_loss_is_the_mean_over_scored_positions_only():
    tc = build_reasoner_config(TINY_REASONER).train
    logits = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[IGNORE_LABEL, 2, 3, IGNORE_LABEL], [1, 1, 4, 2]])
    _, parts = supervision_loss(_output(logits), labels, 0.0, tc)
    nll = -F.log_softmax(logits, -1).gather(-1, label_tokens(labels)[..., None])[..., 0]
    expected = (nll[0, 1:3].mean() + nll[1].mean()) / 2
    assert parts["ce"] == float(expected)
    changed = logits.clone()
    changed[0, 0] += 10.0  # an unscored position's logits do not enter the loss
    assert supervision_loss(_output(changed), labels, 0.0, tc)[1]["ce"] == parts["ce"]


def test_exact_answers_ignore_unscored_positions_only():
    labels = torch.tensor([[IGNORE_LABEL, 2], [1, 2]])
    logits = F.one_hot(torch.tensor([[3, 2], [1, 3]]), 4).float()
    assert answer_exact(logits, labels).tolist() == [True, False]


def test_models_that_read_labels_as_tokens_read_the_pad():
    split = coloring_split(3)
    stored = torch.from_numpy(split["labels"].astype(np.int64))
    labels = torch.from_numpy(scored_labels(split["labels"]))
    batch = {"inputs": torch.from_numpy(split["inputs"].astype(np.int64))}
    for arch in ("gram", "ar", "mdlm"):
        config = ReasonerConfig(
            vocab_size=COLORING.vocab_size, seq_len=COLORING.seq_len, dim=16, n_heads=2, hidden=32
        )
        torch.manual_seed(0)
        model = build_reasoner(arch, config)
        outputs = []
        for target in (labels, stored):
            torch.manual_seed(1)  # the same noise (GRAM's ε, MDLM's masks) for both
            _, out = model(model.initial_carry(batch), batch, target=target)
            outputs.append(out)
        assert torch.equal(outputs[0].logits, outputs[1].logits), arch
        if outputs[0].loss is not None:  # AR and MDLM score the pads they must write
            assert torch.equal(outputs[0].loss, outputs[1].loss), arch
