"""latentloop: models that reason by iterating in latent space and scale their compute at test time."""

__version__ = "0.1.0"
