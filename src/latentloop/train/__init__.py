"""latentloop.train."""
