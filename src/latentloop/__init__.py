"""latentloop: models that reason by iterating in latent space and scale their compute at test time."""

from importlib.metadata import PackageNotFoundError, version

try:  # the one version is pyproject.toml's, as the installed distribution records it
    __version__ = version("latentloop")
except PackageNotFoundError:  # pragma: no cover - the source imported without being installed
    __version__ = "0+unknown"
