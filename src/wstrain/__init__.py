"""wstrain: a training service for a shared lab GPU queue (service, scheduler, worker)."""
