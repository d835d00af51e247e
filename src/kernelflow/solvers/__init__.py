"""Solvers: pure functions on tensors (no scikit-learn inside)."""
