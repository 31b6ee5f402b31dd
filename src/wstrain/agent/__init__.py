"""The per-host agent: claims jobs that fit, plans them, supervises one worker process per
job, exports their metrics."""
