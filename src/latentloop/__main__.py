"""``python -m latentloop`` (also what ``torchrun -m latentloop`` runs)."""

from latentloop.cli import entry

entry()
