"""The working-set runtime: host arena and state, weight and gradient rings, saved
activations, host and device AdamW, the schedule."""
