"""Every recorded result against the code it measured (kvlab.results.manifest): when, at which
revision, on what, and which of its components have changed since.
"""

from __future__ import annotations

from kvlab.components import BENCHMARKS
from kvlab.results import manifest


def revision_cell(entry: dict) -> str:
    """"bcfeff1", "15947c5 + uncommitted changes" or "not recorded"."""
    if entry["revision"] is None:
        return "not recorded"
    return entry["revision"] + (" + uncommitted changes" if entry["dirty"] else "")


def changed_cell(changed: list[str] | None, benchmark: str) -> str:
    """The components of `benchmark` changed since: "none", "all N" (every one it runs), their
    names, or "unknown" (no versions recorded)."""
    if changed is None:
        return "unknown"
    if changed and len(changed) == len(BENCHMARKS.get(benchmark, ())):
        return f"all {len(changed)}"
    return ", ".join(f"`{name}`" for name in changed) or "none"


def manifest_table() -> list[str]:
    """The Markdown table of `kvlab.results.manifest()`: one line per result file."""
    lines = ["| result | benchmark | recorded | revision | on | changed since |",
             "|---|---|---|---|---|---|"]
    for e in manifest():
        where = e["gpu"] or "-"
        if e["host"]:
            where += f" ({e['host']})"
        lines.append(f"| `{e['file']}` | {e['benchmark']} | {e['date']} | {revision_cell(e)} | "
                     f"{where} | {changed_cell(e['changed'], e['benchmark'])} |")
    return lines


def part_times() -> list[str]:
    """Per machine with results made by the CLI: how many of its parts (benchmarks/rerecord.py)
    have a time kept in rerecord_times.json, their seconds in all (at least, where some were
    stopped at a budget: those named), and those not timed yet."""
    import rerecord

    lines = []
    for machine in ("h100", "h200"):
        known, timed = rerecord.parts(machine), rerecord.times(machine)
        seconds = sum(t["seconds"] for name, t in timed.items() if name in known)
        missing = [name for name in known if name not in timed]
        bounds = [name for name in known if timed.get(name, {}).get("at_least")]
        done = len(known) - len(missing)
        lines.append(f"- `{machine}`: {done} of {len(known)} parts timed"
                     + (f", {'at least ' if bounds else ''}{seconds:,.0f} s in all" if done
                        else "")
                     + (f" ({', '.join(bounds)}: stopped at a budget, so a lower bound)"
                        if bounds else "")
                     + (f"; not timed yet: {', '.join(missing)}" if missing else ""))
    return lines


BLOCKS = {"manifest.table": manifest_table, "manifest.part-times": part_times}
