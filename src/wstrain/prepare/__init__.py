"""Token files from text, JSONL, Parquet or `datasets` directories (`wstrain prepare`)."""
