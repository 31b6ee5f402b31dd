"""The table the runtime, long-context and MoE drivers print of their rows: tokens/s, MFU,
device and host peaks against the plan's predictions, and each working-set row's tokens/s
over the resident row of its model in the same file beside its per-round ceilings from
bench/bound.py (the whole link and leanest layout; the row's own link share and layout).
"""

from __future__ import annotations

from typing import Any

from bench.bound import row_ceilings


def _against(row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """A working-set row's tokens/s over the resident row of its model beside it, and
    bench.bound's per-round ceilings (ideal; as planned): the row's gap to each."""
    res = next(
        (
            r
            for r in rows
            if r["name"] == "resident"
            and "error" not in r
            and (r["layers"], r["seq_len"]) == (row["layers"], row["seq_len"])
        ),
        None,
    )
    if res is None or row.get("runtime") != "working_set":
        return ""
    ratio = res["measured_step_seconds"] / row["measured_step_seconds"]
    ideal, planned = row_ceilings(row, res["measured_step_seconds"])
    return f"{ratio:>7.3f}{ideal:>9.3f}{planned:>9.3f}"


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The rows as a fixed-width table; a failed row shows its error."""
    head = (
        f"{'row':<14}{'L':>3}{'batch':>6}{'tok/s':>9}{'MFU':>7}{'dev GiB':>9}{'rsv GiB':>9}"
        f"{'pred':>7}{'RSS GiB':>9}{'arena':>7}{'stall':>7}{'step s':>8}{'pred s':>8}"
        f"{'x res':>7}{'ceiling':>9}{'planned':>9}"
    )
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['name']:<14} FAILED: {r['error'][:100]}")
            continue
        arena = f"{r['arena_gib']:.1f}" if r["arena_gib"] else "-"
        stall = f"{r['stall_share']:.1%}" if r["stall_share"] is not None else "-"
        pred = f"{r['predicted_peak_device_gib']:.1f}" if r["predicted_peak_device_gib"] else "-"
        pred_s = f"{r['predicted_step_seconds']:.1f}" if r["predicted_step_seconds"] else "-"
        label = f"{r['name']}*" if r.get("kernels") == "eager" else r["name"]
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"
        lines.append(
            f"{label:<14}{r['layers']:>3}{r['global_batch']:>6}"
            f"{r['tokens_per_s']:>9.0f}{mfu:>7}{r['peak_device_gib']:>9.1f}"
            f"{r['peak_reserved_gib']:>9.1f}{pred:>7}{r['peak_rss_gib']:>9.1f}{arena:>7}"
            f"{stall:>7}{r['measured_step_seconds']:>8.2f}{pred_s:>8}{_against(r, rows)}"
        )
    if any(r.get("kernels") == "eager" for r in rows):
        lines.append("* eager PyTorch elementwise ops (--eager-kernels)")
    return "\n".join(lines)
