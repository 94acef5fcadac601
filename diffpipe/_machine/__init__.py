"""_machine."""
