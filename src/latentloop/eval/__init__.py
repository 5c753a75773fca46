"""latentloop.eval."""
