"""_optimize."""
