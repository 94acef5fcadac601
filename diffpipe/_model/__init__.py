"""_model."""
