"""`wstrain grant`, `wstrain revoke` and `wstrain grants`: the priority classes above 0 an
admin grants each owner (/v1/grants, contracts/grants.py).

    wstrain grant alice --max-priority 50 --max-jobs 2   # admin: alice may submit <= 50, 2 at once
    wstrain revoke alice                                  # admin: her jobs drop to class 0
    wstrain grants [--json]                               # every grant (admin); your own (user)
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from wstrain.cli.client import call, error_of, unreachable
from wstrain.contracts.grants import MAX_CLASS, MAX_CLASS_JOBS

GRANT_COMMANDS = ("grant", "revoke", "grants")


def _bounded(low: int, high: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} from {low} to {high}")
        return int(text)

    return parse


def add_parsers(cmd: Callable[..., argparse.ArgumentParser]) -> None:
    """The three subcommands, on the main parser's `cmd(name, help)`."""
    s = cmd("grant", "admin: let OWNER submit jobs above priority 0, up to a class and a quota")
    s.add_argument("owner")
    s.add_argument(
        "--max-priority",
        type=_bounded(1, MAX_CLASS, "a priority"),
        required=True,
        help=f"the highest `priority` OWNER's jobs may have, 1..{MAX_CLASS}",
    )
    s.add_argument(
        "--max-jobs",
        type=_bounded(1, MAX_CLASS_JOBS, "a number of jobs"),
        required=True,
        help="how many of OWNER's unfinished jobs above priority 0 may exist at once",
    )
    cmd("revoke", "admin: take OWNER's grant away (its jobs drop to class 0)").add_argument("owner")
    cmd("grants", "list priority grants (an admin sees all, a user its own)").add_argument(
        "--json", action="store_true", help="the server's JSON"
    )


def _row(g: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(g["granted_at"]))
    return (
        f"{g['owner']:<20} {g['max_priority']:>12} {g['class_jobs']:>4}/{g['max_jobs']:<5} "
        f"{g['granted_by']:<16} {when}"
    )


def run(c: httpx.Client, args: argparse.Namespace) -> int:
    if args.cmd == "grant":
        body = {"max_priority": args.max_priority, "max_jobs": args.max_jobs}
        g = call(c, "PUT", f"/v1/grants/{args.owner}", json=body)
        print(
            f"{g['owner']} may submit at priority <= {g['max_priority']}, "
            f"{g['max_jobs']} unfinished jobs above 0 at once ({g['class_jobs']} now)"
        )
    elif args.cmd == "revoke":
        call_no_body(c, "DELETE", f"/v1/grants/{args.owner}")
        print(f"{args.owner}'s grant revoked: its jobs run at priority <= 0 from now on")
    else:
        grants = call(c, "GET", "/v1/grants")["grants"]
        if args.json:
            print(json.dumps(grants, indent=2))
        elif not grants:
            print("no priority grants: only an admin's submissions run above priority 0")
        else:
            print(f"{'owner':<20} {'max_priority':>12} {'jobs':>10} {'granted_by':<16} when")
            for g in grants:
                print(_row(g))
    return 0


def call_no_body(c: httpx.Client, method: str, path: str) -> None:
    """`call` for an answer with no body (204)."""
    try:
        resp = c.request(method, path)
    except httpx.HTTPError as exc:
        raise unreachable(c, exc) from exc
    if resp.status_code >= 400:
        raise error_of(resp)
