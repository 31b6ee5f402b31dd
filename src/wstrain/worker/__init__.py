"""The worker process (`wstrain-worker`): trains one attempt of one job with the runtime its
plan names."""
