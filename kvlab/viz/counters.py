"""Figures of why L2 prefetch pays or not: the paper's H20 counters beside the H200's (Table 5.2),
and the L2 model's answer for one shape (`kvlab.sim`).

Plain functions to `plotly.graph_objects.Figure`; the caller passes the provenance of each
source, and every figure says which numbers are recorded, which are the paper's and which are
modelled.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.checks import check_real
from kvlab.profile import paper
from kvlab.viz.layout import note_figure, style

__all__ = ["PERCENT_COUNTERS", "CYCLE_COUNTERS", "modelled_l2_figure", "table_5_2_figure"]

PERCENT_COUNTERS = ("l2_hit_pct", "sm_throughput_pct", "memory_throughput_pct")
CYCLE_COUNTERS = ("long_scoreboard_cycles", "cpi")
SHORT = {"l2_hit_pct": "L2 hit<br>rate", "sm_throughput_pct": "SM<br>throughput",
         "memory_throughput_pct": "memory<br>throughput",
         "long_scoreboard_cycles": "long<br>scoreboard", "cpi": "CPI"}
BARS = (("H20 (paper), no prefetch", "#aec7e8"), ("H20 (paper), prefetch", "#1f77b4"),
        ("H200, no prefetch", "#ffbb78"), ("H200, prefetch", "#ff7f0e"))
RECORD_COMMAND = "python -m kvlab bench counters --models {model}"


def table_5_2_figure(model: str, entries: list[dict], provenance: str,
                     height: int = 420) -> go.Figure:
    """Grouped bars for `model`: each counter of the paper's Table 5.2 without and with prefetch,
    the paper's H20 figures (`kvlab.profile.paper`) and ours; percentages on the left, cycles per
    instruction on the right. `entries`: rows of a recorded `bench counters` result's "table"
    for one kernel and point (empty: the H200's bars are absent, and the subtitle says so). A
    model that neither has gets a note saying so, and how to record it, instead of empty axes."""
    ours = {e["column"]: e for e in entries if e["model"] == model}
    theirs = {c: paper.TABLE_5_2[c].get(model) for c in (*PERCENT_COUNTERS, *CYCLE_COUNTERS)}
    if not ours and not any(theirs.values()):
        return note_figure(f"Table 5.2's counters: {model}", provenance,
                           f"the paper has no {model}, and no H200 counters are recorded for it;"
                           f"<br>run on a GPU:<br>{RECORD_COMMAND.format(model=model)}", height)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.12,
                        subplot_titles=("% of peak", "cycles per instruction"))
    fig.update_annotations(font_size=13)
    for i, (name, color) in enumerate(BARS):
        for col, counters in ((1, PERCENT_COUNTERS), (2, CYCLE_COUNTERS)):
            if i < 2:
                values = [theirs[c][i] if theirs[c] else None for c in counters]
            else:
                key = "ours_baseline" if i == 2 else "ours_prefetch"
                values = [ours[c][key] if c in ours else None for c in counters]
            fig.add_trace(go.Bar(name=name, legendgroup=name, showlegend=col == 1,
                                 marker_color=color, x=[SHORT[c] for c in counters], y=values,
                                 hovertemplate=f"{name}<br>%{{x}}: %{{y:.2f}}<extra></extra>"),
                          row=1, col=col)
    fig.update_layout(barmode="group")
    fig.update_xaxes(tickangle=0)
    speedup = paper.SPEEDUP.get(model)
    lines = [f"{paper.GPU}: {speedup:.2f}x kernel speedup with prefetch" if speedup else
             f"the paper has no {model}"]
    if ours:
        e = next(iter(ours.values()))
        hits = [e for e in entries if e["model"] == model and e["column"] == "speedup"]
        if hits:  # a line each: a subtitle line fits a 500 px chart
            lines.append(f"H200: {hits[0]['ours_prefetch']:.2f}x kernel speedup with prefetch, "
                         "by ncu's durations")
        lines.append(f"H200: {e['kernel']}, batch {e['batch']} x {e['context']}, "
                     f"{e['num_sms_used']} SMs, {e['prefetch']}")
    else:
        lines += [f"H200: not recorded for {model}; run on a GPU:",
                  RECORD_COMMAND.format(model=model)]
    title = f"The paper's counters, {model}" if speedup else f"Table 5.2's counters: {model}"
    return style(fig, title, provenance, *lines, height=height)


def modelled_l2_figure(results: dict[str, object], shape: str, provenance: str,
                       height: int = 360, times_ms: dict[str, float] | None = None,
                       roofline_gbps: float | None = None, *, title: str = "L2, modelled",
                       details: tuple[str, ...] = ()) -> go.Figure:
    """Bars per prefetch setting (`results`: label -> kvlab.sim.L2Result): the modelled L2 hit
    rate of the loads, the share of loads that found their fill in flight, and the hit rate as
    ncu's headline counts it (every lookup: the prefetches' and the L2 fabric's too,
    `L2Result.ncu_hit_rate`); the hover gives the DRAM bytes. `shape` describes the launch
    modelled, `details` add subtitle lines below it (e.g. what of the launch was replayed),
    `title` names the chart (e.g. the GPU it is modelled for). With `times_ms` (label -> the
    time model's ms) and `roofline_gbps` (the copy roofline of the SMs), a second panel gives
    each setting's modelled time and its DRAM GB/s as % of that roofline. Raises ValueError for
    `results` empty, a `roofline_gbps` or a time of `times_ms` that is not a finite number > 0,
    or `times_ms` without a setting of `results`."""
    if not results:
        raise ValueError(f"results={results!r}: must hold at least one prefetch setting")
    if roofline_gbps is not None:
        check_real("roofline_gbps", roofline_gbps, 0, open_min=True)
    if times_ms is not None:
        missing = [name for name in results if name not in times_ms]
        if missing:
            raise ValueError(f"times_ms={times_ms!r}: has no time of {missing}")
        for name in results:
            check_real(f"times_ms[{name!r}]", times_ms[name], 0, open_min=True)
    names = list(results)
    hits = [100 * r.hit_rate for r in results.values()]
    as_ncu = [100 * r.ncu_hit_rate for r in results.values()]
    pending = [100 * r.demand_pending / r.demand_sectors if r.demand_sectors else 0.0
               for r in results.values()]
    dram = [r.dram_bytes / 2**20 for r in results.values()]
    timed = times_ms is not None and roofline_gbps is not None
    # NOTE: no subplot titles: the axis titles name each panel, and a title above a panel sits
    # where the bars' text does
    fig = make_subplots(rows=1, cols=2 if timed else 1, column_widths=[0.65, 0.35] if timed
                        else None, horizontal_spacing=0.15)
    for trace in (
        go.Bar(name="hits (ready in L2)", x=names, y=hits, marker_color="#2ca02c",
               text=[f"{h:.1f}%" for h in hits], textposition="outside", cliponaxis=False,
               customdata=dram, hovertemplate="%{x}: %{y:.1f}% hits<br>DRAM %{customdata:.0f} "
               "MiB<extra></extra>"),
        go.Bar(name="found in flight (no hit)", x=names, y=pending, marker_color="#c7c7c7",
               text=[f"{p:.1f}%" for p in pending], textposition="outside", cliponaxis=False,
               hovertemplate="%{x}: %{y:.1f}% of loads found their fill in flight"
               "<extra></extra>"),
        go.Bar(name="ncu's hit rate (every lookup)", x=names, y=as_ncu,
               marker_color="#1f77b4", text=[f"{h:.1f}%" for h in as_ncu],
               textposition="outside", cliponaxis=False,
               hovertemplate="%{x}: %{y:.1f}% of all L2 lookups hit (prefetches', the "
               "fabric's)<extra></extra>"),
    ):
        fig.add_trace(trace, row=1, col=1)
    fig.update_yaxes(title_text="% of loads' sectors", range=[0, 115], row=1, col=1)
    lines = [shape, *details]
    if timed:
        us = [1e3 * times_ms[n] for n in names]
        share = [100 * r.dram_bytes / (times_ms[n] * 1e-3) / (roofline_gbps * 1e9)
                 for n, r in results.items()]
        fig.add_trace(go.Bar(
            name="time (time model)", x=names, y=us, marker_color="#9467bd",
            text=[f"{u:.0f} us<br>DRAM {p:.0f}%" for u, p in zip(us, share, strict=True)],
            textposition="outside", cliponaxis=False, customdata=share,
            hovertemplate="%{x}: %{y:.1f} us modelled<br>DRAM at %{customdata:.0f}% of the "
            f"copy roofline ({roofline_gbps:.0f} GB/s)<extra></extra>"), row=1, col=2)
        # the bars' text, two lines, above the tallest bar
        fig.update_yaxes(title_text="us, modelled", range=[0, 1.45 * max(us)], row=1, col=2)
        lines += ["time: kvlab.sim.time_model (no term for prefetch's own cost)",
                  f"copy roofline {roofline_gbps:.0f} GB/s; CPI and stalls: ncu only"]
    # the legend in two columns: two rows, not four, below a chart of 500 px
    fig.update_layout(barmode="group", legend=dict(entrywidth=0.5, entrywidthmode="fraction"))
    return style(fig, title, provenance, *lines, height=height)
