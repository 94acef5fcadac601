"""_plan."""
