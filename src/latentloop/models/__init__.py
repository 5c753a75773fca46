"""Models: the recurrent-depth LM and the recursive reasoners."""
