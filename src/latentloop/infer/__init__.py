"""Inference for the puzzle reasoners: depth and width scaling (see :mod:`latentloop.infer.scaling`)."""

from latentloop.infer.scaling import SELECTIONS, SolveResult, select_sample, solve

__all__ = ["SELECTIONS", "SolveResult", "select_sample", "solve"]
