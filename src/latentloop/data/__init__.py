"""latentloop.data."""
