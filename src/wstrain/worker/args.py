"""The worker process's command line (worker/main.py): the job dir, the peaks its MFU divides
by, and the directories it may read, share host state through, and spill to.

    args = parse_args(["--job-dir", "STATE/jobs/ID", "--spill-dir", "/nvme/spill"], "worker")
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--job-dir", type=Path, required=True)
    parser.add_argument(
        "--measured-peak-flops",
        type=float,
        help="FLOP/s of a bf16 GEMM measured on this GPU (the node profile's matmul_flops): "
        "what MFU divides by on a chip the table (contracts/chips.py) does not know",
    )
    parser.add_argument(
        "--cpu-peak-flops",
        type=float,
        help="FLOP/s a CPU job's MFU divides by (unset or 0: no MFU on CPU)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument(
        "--shm-dir",
        type=Path,
        default=Path("/dev/shm"),
        help="tmpfs where the ranks of a data-parallel working-set job share their host state",
    )
    parser.add_argument(
        "--spill-dir",
        type=Path,
        help="a local disk's directory for the spill file of a plan that spills layers' "
        "AdamW moments (budget.disk_gib; default: JOB_DIR/spill); removed at a clean exit",
    )
    parser.add_argument(
        "--data-roots",
        type=json.loads,
        default=["/"],
        help="JSON list of the directories the job may read (the agent passes its own)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="the service's state dir, which the job may not read (default: the job dir's "
        "grandparent, STATE/jobs/ID)",
    )
    return parser.parse_args(argv)
