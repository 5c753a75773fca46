"""latentloop CLI: generate commands."""

from latentloop.cli.app import app, data_app  # noqa: F401
