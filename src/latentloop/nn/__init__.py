"""Shared building blocks: every model in latentloop is composed from these."""

from latentloop.nn.attention import Attention, KVHook
from latentloop.nn.blocks import (
    BLOCKS,
    Block,
    PeriNormBlock,
    PostNormBlock,
    PreNormBlock,
    SandwichBlock,
    SequenceMLPBlock,
    compile_blocks,
)
from latentloop.nn.linear import Linear
from latentloop.nn.mlp import GatedMLP
from latentloop.nn.norm import RMSNorm
from latentloop.nn.rope import AxialRotaryEmbedding, RotaryEmbedding, apply_rope, rope_frequencies

__all__ = [
    "BLOCKS",
    "Attention",
    "AxialRotaryEmbedding",
    "Block",
    "GatedMLP",
    "KVHook",
    "Linear",
    "PeriNormBlock",
    "PostNormBlock",
    "PreNormBlock",
    "RMSNorm",
    "RotaryEmbedding",
    "SandwichBlock",
    "SequenceMLPBlock",
    "apply_rope",
    "compile_blocks",
    "rope_frequencies",
]
