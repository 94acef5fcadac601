"""schedules/families."""
