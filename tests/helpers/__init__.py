"""Helpers that several test modules share: imported from here, never from another `test_*.py`,
so pytest collects each test once and a test file can be moved or deleted on its own.

- cli.py: the `wstrain` CLI run in-process, with its exit code and output;
- jobs.py: a finished job's checkpointed weights and its state history;
- specs.py: job specs that several areas plan (working-set specs, a deliberately slow plan);
- tokenizers.py: a small word-level tokenizers tokenizer on disk.
"""
