"""Validity-preserving grid transforms shared by the puzzle tasks (dihedral group, value permutations)."""

from __future__ import annotations

import numpy as np

#: The 8 symmetries of the square, by index: rotations by 0/90/180/270 degrees, then the same after a
#: transpose. ``DIHEDRAL_INVERSE[k]`` undoes transform ``k``.
DIHEDRAL_NAMES = (
    "identity",
    "rot90",
    "rot180",
    "rot270",
    "transpose",
    "flip_ud",
    "anti_transpose",
    "flip_lr",
)
DIHEDRAL_INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)


def dihedral(grid: np.ndarray, k: int) -> np.ndarray:
    """Apply symmetry ``k`` (0..7) of the square to the first two axes of ``grid``."""
    if not 0 <= k < 8:
        raise ValueError(f"dihedral transform index must be in 0..7, got {k}")
    out = grid.swapaxes(0, 1) if k >= 4 else grid
    return np.ascontiguousarray(np.rot90(out, k % 4))


def inverse_dihedral(grid: np.ndarray, k: int) -> np.ndarray:
    """Undo :func:`dihedral` ``k``."""
    return dihedral(grid, DIHEDRAL_INVERSE[k])


def permute_values(grid: np.ndarray, mapping: np.ndarray) -> np.ndarray:
    """Replace every value ``v`` of ``grid`` by ``mapping[v]`` (``mapping`` is a lookup table)."""
    return np.asarray(mapping)[grid]


def inverse_mapping(mapping: np.ndarray) -> np.ndarray:
    """The lookup table that undoes the permutation ``mapping``."""
    mapping = np.asarray(mapping)
    inverse = np.empty_like(mapping)
    inverse[mapping] = np.arange(len(mapping), dtype=mapping.dtype)
    return inverse
