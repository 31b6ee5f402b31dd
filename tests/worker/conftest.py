"""The worker's tests: one torch thread in each test process. CI runs the suite in two
pytest-xdist workers on 2 cores; torch's default of a thread per core would run 4 threads
on 2 cores, each matmul of these tiny models waiting on the other worker's. tests/conftest.py
sets OMP_NUM_THREADS before torch is imported; this holds where torch came in first."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
