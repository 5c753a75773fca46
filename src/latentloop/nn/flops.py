"""Training compute counted from the shapes a model runs: the FLOPs of its matrix products.

:class:`FlopCounter` hooks every ``nn.Linear`` and every :class:`~latentloop.nn.attention.Attention` core of a
module and adds up what each call multiplies, ``2 · rows · in · out`` for a linear layer and
``4 · B · L_q · L_k · dim`` for attention (``QKᵀ`` and ``PV``). Elementwise work (norms, activations, the noise
of GRAM) is left out, as ``torch.utils.flop_counter.FlopCounterMode`` leaves it out. A pass that records a
graph costs three times its forward in training (the backward multiplies twice: gradients of the inputs and
of the weights); a pass under ``torch.no_grad`` costs its forward only.

The count is linear in the batch, so one sample run through an eager twin of the model (the same config,
any weights) gives the cost of a batch of any size, whatever the training model is wrapped in (compiled, DDP,
FSDP).
"""

from __future__ import annotations

import torch
from torch import nn

from latentloop.nn.attention import Attention


class FlopCounter:
    """Context manager counting the matmul FLOPs of ``module``'s forward passes inside it.

    ``with_grad`` holds those run while autograd records (they will be backpropagated), ``without_grad`` those
    under ``torch.no_grad``; :attr:`training_flops` is what a forward and backward of them costs.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.with_grad = 0
        self.without_grad = 0
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> FlopCounter:
        for layer in self.module.modules():
            if isinstance(layer, nn.Linear):
                self._handles.append(layer.register_forward_hook(self._linear))
            elif isinstance(layer, Attention):
                self._handles.append(layer.register_forward_hook(self._attention))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @property
    def forward_flops(self) -> int:
        """FLOPs of the forward passes alone."""
        return self.with_grad + self.without_grad

    @property
    def training_flops(self) -> int:
        """FLOPs of the forward passes plus the backward of those that record a graph (twice their forward)."""
        return 3 * self.with_grad + self.without_grad

    def _add(self, flops: int) -> None:
        if torch.is_grad_enabled():
            self.with_grad += flops
        else:
            self.without_grad += flops

    def _linear(self, layer: nn.Linear, inputs: tuple, output: torch.Tensor) -> None:
        self._add(2 * inputs[0].numel() * layer.out_features)

    def _attention(self, layer: Attention, inputs: tuple, output: torch.Tensor) -> None:
        batch, length, dim = inputs[0].shape
        # Without a KV cache every query attends to every key of the same call (a causal mask is not skipped).
        self._add(4 * batch * length * length * dim)
