"""The API process (FastAPI over the Redis job store), the `wstrain` CLI and `wstrain serve`.
Never imports torch."""
