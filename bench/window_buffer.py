"""A lever weighed before building: the levels DP with a write buffer that grows into the
window's unfilled device bytes. CPU only.

    python -m bench.window_buffer bench/results/runtime/working-set-rows-h200-2026-11-27.json \
        --row ws-20

The DP (planning/levels.py) lets a home layer's saved sets queue for the D2H link only
within the write buffer (WRITE_BUFFER_BYTES, 1 GiB, unless the plan took more). The window's
layers run last in the forward and send nothing, so the outbound link idles through them,
while the device bytes their sets will take are still free. Here each home layer's cap is
the write buffer plus the window's sets (all unfilled while the home layers run), and the
backlog left at the home layers' end must drain, at the link's rate, within the window's
forward to the plain write buffer. That is conservative: it ignores the window's own sets
filling the device while the backlog drains. Each window is re-solved on the row's own node
profile and link share, and it prints the best per-round recomputation cost with and without
this change. The plain DP reproduces the row's planned recomputation.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace

import numpy as np

from bench.bound import layout_of
from bench.specs import link_share_of, node_from_row, spec_dims_of
from wstrain.contracts.calibration import LEVELS
from wstrain.planning import cost_model as cm
from wstrain.planning import memory_model as mm
from wstrain.planning.candidates import fill_window
from wstrain.planning.levels import _quantum, solve

log = logging.getLogger("bench.window_buffer")


def window_costs(row: dict) -> list[tuple[int, float, float]]:  # type: ignore[type-arg]
    """(window, per-round cost as planned, per-round cost with the grown write buffer) of
    every window that fits: recomputation left plus the window's exposed transfer, seconds."""
    share, cm.LINK_SHARE = cm.LINK_SHARE, link_share_of(row)
    try:
        return _window_costs(row)
    finally:
        cm.LINK_SHARE = share


def _window_costs(row: dict) -> list[tuple[int, float, float]]:  # type: ignore[type-arg]
    spec, dims = spec_dims_of(row)
    node = node_from_row(row)
    # the row's own layout, with the split optimizer's device layers as planned
    planned, _ = layout_of(row, row["plan"]["micro_batch"], planned=True, overlap=False)
    lay = replace(planned, device_layers=row["plan"]["working_set"]["device_layers"])
    L, X = dims.num_layers, lay.units
    lc = cm.layer_cost(dims, spec, lay, node)
    plain = solve([lc] * L)
    saved = [mm.saved_bytes(dims, spec, lv, 0, home=False) for lv in range(LEVELS)]
    out = []
    for w in range(L + 1):
        spare = mm.spare_window_bytes(dims, spec, lay, w)
        if spare < 0:
            break
        win = fill_window(w, lc, saved, spare)
        window_s = win.cost_s(lc)
        if w == L:
            out.append((w, window_s, window_s))
            continue
        window_bytes = sum(saved[lv] for lvs in win.rows() for lv in lvs)
        grown = replace(lc, cap_s=lc.cap_s + cm.link_seconds(window_bytes, node))
        values = solve([grown] * (L - w)).values[L - w]  # (states,) by backlog at the end
        quantum_s, _ = _quantum([grown])
        drains = np.arange(len(values)) * quantum_s <= lc.cap_s + w * X * lc.compute_s
        home_s = (L - w) * X * lc.compute_s
        as_planned = home_s - plain.best_s(L - w)
        with_grown = home_s - max(
            float(np.max(np.where(drains, values, -np.inf))), plain.best_s(L - w)
        )
        out.append((w, as_planned + window_s, with_grown + window_s))
    return out


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="a bench/results/*.json file")
    p.add_argument("--row", default="ws-20")
    args = p.parse_args()
    with open(args.results) as f:
        row = next(r for r in json.load(f) if r["name"] == args.row)
    spec, _ = spec_dims_of(row)
    rounds = spec.global_batch // row["plan"]["micro_batch"]
    costs = window_costs(row)
    w0, base_s, _ = min(costs, key=lambda c: c[1])
    w1, _, grown_s = min(costs, key=lambda c: c[2])
    log.info(
        "%s: as planned window %d, %.2f s of recomputation a step; with the grown write "
        "buffer window %d, %.2f s: %.2f s less",
        args.row,
        w0,
        base_s * rounds,
        w1,
        grown_s * rounds,
        (base_s - grown_s) * rounds,
    )


if __name__ == "__main__":
    main()
