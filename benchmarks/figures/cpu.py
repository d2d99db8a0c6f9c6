"""The CPU benchmarks: the dashboard's start-up and redraw times (results/cpu/dashboard.json),
the block pool's and the L2 model's speed on one core (cache.json, l2sim.json).
"""

from __future__ import annotations

from kvlab.results import load_result


def dashboard_table(result: dict) -> list[str]:
    """The dashboard's start-up and redraw times (results/cpu/dashboard.json) against targets (a
    median above its target marked "missed"; the last chart of a redraw has none), and each tab's
    first view (built when first selected; no target)."""
    names = {"dashboard_python_s": "`kvlab.dashboard()` in a fresh Python process",
             "first_chart_s": "first chart in a fresh kernel (JupyterLab, Chromium)",
             "redraw_s": "slider change to its first chart redrawn in the page",
             "redraw_all_s": "slider change to the last of its three charts redrawn"}
    lines = ["| what | min | median | max | runs | target (median) |", "|---|---|---|---|---|---|"]
    for key, name in names.items():
        s, target = result[key], result["targets_s"].get(key)
        goal = "-" if target is None else (
            f"{target:g} s" + (", missed" if s["median"] > target else ""))
        lines.append(f"| {name} | {s['min']:.3f} s | {s['median']:.3f} s | {s['max']:.3f} s | "
                     f"{len(s['runs'])} | {goal} |")
    for title, s in result["tab_first_view_s"].items():
        lines.append(f"| first view of the {title} tab, same process (built then) | "
                     f"{s['min']:.3f} s | {s['median']:.3f} s | {s['max']:.3f} s | "
                     f"{len(s['runs'])} | - |")
    return lines


def speeds_table(cache: dict, l2sim: dict) -> list[str]:
    """The block pool's allocate/free pairs and the L2 model's sectors a second on one core,
    against their targets."""
    lines = ["| what | per second | target |", "|---|---|---|"]
    for name, value, target in (
            ("block pool: allocate + free pairs, one at a time", cache["pool_pairs_per_s"],
             cache["target_pairs_per_s"]),
            ("block pool: pairs, 16 a call", cache["pool_pairs_per_s_16_per_call"], None),
            ("L2 model: sector accesses, cache alone", l2sim["cache_sectors_per_s"],
             l2sim["target_sectors_per_s"]),
            ("L2 model: sector accesses, whole simulation", l2sim["simulate_sectors_per_s"],
             l2sim["target_sectors_per_s"])):
        goal = "-" if target is None else f"{target:,.0f}"
        lines.append(f"| {name} | {value:,.0f} | {goal} |")
    return lines


BLOCKS = {
    "cpu.dashboard": lambda: dashboard_table(load_result("cpu", "dashboard")),
    "cpu.speeds": lambda: speeds_table(load_result("cpu", "cache"), load_result("cpu", "l2sim")),
}
