"""The worker process as its agent starts it, for the worker tests: a job dir holding the
spec and its plan (STATE/jobs/ID, as the agent lays it out) and the command line.

    job_dir = write_job(tmp_path, spec, plan)
    subprocess.run(worker_argv(job_dir, "--threads", "1"))
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.conftest import REPO
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec


def write_job(root: Path, spec: JobSpec, plan: Plan) -> Path:
    """root/state/jobs/job-1 with spec.json and plan.json."""
    job_dir = root / "state" / "jobs" / "job-1"
    job_dir.mkdir(parents=True)
    (job_dir / "spec.json").write_text(spec.model_dump_json())
    (job_dir / "plan.json").write_text(plan.model_dump_json())
    return job_dir


def worker_argv(job_dir: Path, *extra: str) -> list[str]:
    """`python -m wstrain.worker.main` of the job, one CPU thread, reading the repo (the
    shipped corpus) and the test's own directory."""
    roots = [str(REPO), str(job_dir.parents[2])]
    return [
        sys.executable,
        "-m",
        "wstrain.worker.main",
        "--job-dir",
        str(job_dir),
        "--threads",
        "1",
        "--data-roots",
        json.dumps(roots),
        *extra,
    ]
