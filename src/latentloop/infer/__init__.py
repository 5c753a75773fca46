"""latentloop.infer."""
