"""Host and layer profiles the planner calibrates with (`python -m wstrain.worker.profile.node`)."""
