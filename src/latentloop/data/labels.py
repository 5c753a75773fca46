"""One convention for label positions that are not scored, for the LM and the puzzles alike.

Every label tensor that a model, a loss or a metric computes with marks a position that is not scored with
:data:`IGNORE_LABEL` (-100, PyTorch's ``ignore_index``): the LM's prompt and padding, a puzzle's padding and
the adjacency part of a graph-colouring row.

Stored puzzle datasets are ``uint8`` and mark those positions with :data:`STORED_IGNORE` (0, the pad token),
their ``ignore_label_id``, as the official TRM/HRM dataset builders write them. A stored row becomes a label
row as it is loaded (:func:`scored_labels`), after any augmentation, which permutes tokens. Models that read a
label row as tokens (GRAM's posterior, AR's teacher forcing, MDLM's noising) see an unscored position as the
pad token (:func:`label_tokens`).
"""

from __future__ import annotations

import numpy as np
import torch

IGNORE_LABEL = -100
"""The label of a position that is not scored."""

STORED_IGNORE = 0
"""What a stored puzzle dataset holds at a position that is not scored: the pad token."""


def scored_labels(stored: np.ndarray) -> np.ndarray:
    """``int64`` label rows from stored token rows: :data:`STORED_IGNORE` becomes :data:`IGNORE_LABEL`."""
    labels = np.asarray(stored).astype(np.int64)
    labels[labels == STORED_IGNORE] = IGNORE_LABEL
    return labels


def label_tokens(labels: torch.Tensor) -> torch.Tensor:
    """The token rows of ``labels``: an unscored position holds the pad token (for models that embed them)."""
    return labels.masked_fill(labels == IGNORE_LABEL, STORED_IGNORE)
