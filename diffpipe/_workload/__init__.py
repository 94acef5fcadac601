"""_workload."""
