"""latentloop: models that reason by iterating in latent space and scale their compute at test time."""

import os
from importlib.metadata import PackageNotFoundError, version

# MKL's strict conditional numerical reproducibility: a matrix product rounds alike on any number of threads.
# Without it MKL splits the inner dimension of a product with a small output (a weight gradient of a narrow
# head, say 7 x 1152 @ 1152 x 64) across the threads, so a run's numbers would depend on its thread count. Strict
# mode rounds some products differently from MKL's default on one thread too, so runs made without it are not
# reproduced bit for bit. MKL reads this at its first call, so it is set before torch does any product; a value
# the user set is kept.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

try:  # the one version is pyproject.toml's, as the installed distribution records it
    __version__ = version("latentloop")
except PackageNotFoundError:  # pragma: no cover - the source imported without being installed
    __version__ = "0+unknown"
