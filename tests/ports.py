"""Loopback ports for the suite's servers, which never collide.

`socket.bind(("127.0.0.1", 0))` hands out a port from the kernel's ephemeral range
(32768-60999 here), and the port is free only until the socket closes: two xdist workers
may be handed the same one, or an outbound connection takes it, before the server binds it.
CI saw it: a test API failed to bind, and the tests talked to another worker's API on the
same port. Here each xdist worker takes ports from its own block below the ephemeral range,
in order, never twice, skipping any that something else holds.
"""

from __future__ import annotations

import itertools
import os
import socket

BLOCK_PORTS = 2_000  # a worker's ports; a whole run calls free_port a few hundred times
FIRST_PORT = 12_000  # blocks for 8 workers end at 28,000, under the ephemeral range's 32,768


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # "gw3"; absent when run serially
    digits = worker.removeprefix("gw")
    return int(digits) if digits.isdigit() else 0


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_start = FIRST_PORT + _worker_index() * BLOCK_PORTS
_ports = itertools.count(_start)


def free_port() -> int:
    """A loopback port no other test process is handed, and free now."""
    for port in _ports:
        if port >= _start + BLOCK_PORTS:
            raise RuntimeError(
                f"xdist worker {_worker_index()} used all {BLOCK_PORTS} of its ports "
                f"from {_start}; raise BLOCK_PORTS in tests/ports.py"
            )
        if _bindable(port):
            return port
    raise AssertionError("unreachable: itertools.count never ends")
