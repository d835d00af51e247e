"""Explicit feature maps: random features, Taylor features of the Gaussian kernel, Nyström."""
