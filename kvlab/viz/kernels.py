"""Figures of decode-attention kernel benchmarks: GB/s against the roofline, prefetch speedups.

Plain functions from benchmark rows (the `rows` of `kvlab.bench.attention.run` or of a recorded
result from `kvlab.results`) to `plotly.graph_objects.Figure`. The numbers are measurements; the
caller says where they were measured (`provenance`, e.g. "recorded on NVIDIA H200, 2026-11-29" or
`kvlab.device.device_label()`), and every title carries it.
"""

from __future__ import annotations

import plotly.graph_objects as go

from kvlab.checks import check_real
from kvlab.results import speedups
from kvlab.viz.layout import check_height, style

__all__ = ["AUTO_MODES", "PAPER_REFERENCE", "bandwidth_figure", "block_order_figure",
           "fp8_speedup_figure", "gpu_speedup_figure", "mixed_figure", "prefetch_speedup_figure",
           "variant"]

PAPER_REFERENCE = "paper: 1.84-2.15x, vLLM + L2 prefetch on H20 (arXiv 2504.06319)"
KERNEL_COLORS = {"vllm_v1": "#1f77b4", "vllm_v1_in_order": "#0b3c68", "gqa": "#2ca02c",
                 "gqa_in_order": "#145a14", "gqa_fp8": "#98df8a", "gqa_split_longest": "#bcbd22",
                 "auto": "#17becf", "sdpa": "#7f7f7f", "read": "#d4a017",
                 "vllm_own": "#aec7e8", "flashinfer": "#d62728", "flashinfer_fp8": "#ff9896",
                 "flashinfer_tc": "#9467bd", "flashinfer_tc_fp8": "#c5b0d5"}
KERNEL_NAMES = {"vllm_v1": "vllm_v1", "vllm_v1_in_order": "vllm_v1, blocks in order", "gqa": "gqa",
                "gqa_in_order": "gqa, blocks in order",
                "gqa_fp8": "gqa on an fp8 cache (its bytes)",
                "gqa_split_longest": "gqa, split planned as if all were the longest",
                "auto": "auto: kvlab's choice", "sdpa": "sdpa (PyTorch, dense K, V)",
                "read": "read: the same bytes, one plain read (the bound at this size)",
                "vllm_own": "vLLM's own kernel (built from its source)",
                "flashinfer": "FlashInfer decode (CUDA cores, gqa's K/V)",
                "flashinfer_fp8": "FlashInfer decode on the fp8 cache",
                "flashinfer_tc": "FlashInfer, tensor-core path (gqa's K/V)",
                "flashinfer_tc_fp8": "FlashInfer, tensor cores, fp8 cache"}
# How a kernel="auto" row chose its family and prefetch setting (`auto_mode`)
AUTO_MODES = {"tuned": "tuned at this point", "reused": "reused from another shape of its bucket",
              "recorded": "the recorded choice"}
PREFETCH_COLORS = ("#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#d62728")
BAR_ROW_PX = 22  # the bandwidth figure's height per bar
BANDWIDTH_FRAME_PX = 240  # its title, x axis and legend


def variant(row: dict) -> str:
    """A row's kernel and prefetch setting, e.g. "gqa / line K+V d=1"; for kernel="auto" the
    family it ran and, where recorded, how it chose ("auto tuned (gqa) / none": tuned here,
    reused from another shape of its bucket, or the recorded choice); sdpa rows are "sdpa", plain
    reads "read"."""
    if row["kernel"] in ("sdpa", "read"):
        return row["kernel"]
    kernel = row["kernel"]
    if kernel == "auto":
        mode = f" {row['auto_mode']}" if row.get("auto_mode") else ""
        kernel = f"auto{mode} ({row['family']})"
    return f"{kernel} / {row['prefetch']}"


def _one_point(rows: list[dict]) -> tuple[str, int, int, int | None]:
    points = {(r["model"], r["batch"], r["context"]) for r in rows}
    if len(points) != 1:
        raise ValueError(f"rows cover {len(points)} (model, batch, context) points: must cover one")
    block_sizes = {r["block_size"] for r in rows} - {None}
    if len(block_sizes) > 1:
        raise ValueError(f"rows have block sizes {sorted(block_sizes)}: must have one")
    model, batch, context = points.pop()
    return model, batch, context, next(iter(block_sizes), None)


def bandwidth_figure(
    rows: list[dict],
    roofline_gbps: float,
    provenance: str,
    selected: str | None = None,
    height: int = 420,
    note: str = "",
) -> go.Figure:
    """Bars, GB/s of K+V read, one per variant (kernel + prefetch) at one benchmark point.

    rows: benchmark rows of one (model, batch, context) and at most one block size (sdpa rows have
        block_size None); drawn in the given order.
    roofline_gbps: the copy roofline measured in the same run (> 0); a dashed line marks it and
        each bar's text and hover give its % of it.
    selected: a `variant(row)` to outline (the one chosen in the dashboard), or None.
    note: a subtitle line, e.g. how the point shown differs from the one asked for.
    A row whose "basis" is "interpolated" or "extrapolated" (kvlab.predict's answer, not a
    measurement) is hatched, with a whisker over its "gbps_band" (lo, hi), and says so on hover.
    The legend names each kernel's colour, the roofline and, where drawn, the modelled hatch;
    hover says how an auto row chose.
    Raises ValueError if `rows` is empty or spans several points or block sizes, for a
    `roofline_gbps` that is not a finite number > 0, or a `height` not an integer in [10, 100000].
    """
    check_real("roofline_gbps", roofline_gbps, 0, open_min=True)
    check_height(height)
    if not rows:
        raise ValueError("rows is empty: need the rows of one benchmark point")
    model, batch, context, block_size = _one_point(rows)
    names = [variant(r) for r in rows]
    pct = [100 * r["gbps"] / roofline_gbps for r in rows]
    modelled = [r.get("basis", "measured") != "measured" for r in rows]
    how = [f"<br>auto: {AUTO_MODES.get(r.get('auto_mode'), 'chosen by kvlab')}"
           if r["kernel"] == "auto" else
           f"<br>modelled ({r['basis']}): 90% of held-out errors within "
           f"{r['gbps_band'][0]:,.0f}-{r['gbps_band'][1]:,.0f} GB/s" if m else ""
           for r, m in zip(rows, modelled, strict=True)]
    whiskers = None
    if any(modelled):
        whiskers = dict(type="data", symmetric=False, color="#333", thickness=1.5, width=4,
                        array=[r["gbps_band"][1] - r["gbps"] if m else 0
                               for r, m in zip(rows, modelled, strict=True)],
                        arrayminus=[r["gbps"] - r["gbps_band"][0] if m else 0
                                    for r, m in zip(rows, modelled, strict=True)])
    # horizontal bars, one row each in the given order: the labels read across, however many
    bars = go.Bar(
        name="GB/s",
        orientation="h",
        y=names,
        x=[r["gbps"] for r in rows],
        text=[f"{p:.0f}%" for p in pct],
        textposition="outside",
        cliponaxis=False,
        showlegend=False,
        customdata=[[r["ms"], p, h] for r, p, h in zip(rows, pct, how, strict=True)],
        error_x=whiskers,
        marker=dict(
            color=[KERNEL_COLORS.get(r["kernel"], "gray") for r in rows],
            line=dict(color="black", width=[3 if n == selected else 0 for n in names]),
            pattern=dict(shape=["/" if m else "" for m in modelled], fgcolor="white"),
        ),
        hovertemplate="%{y}<br>%{x:.0f} GB/s = %{customdata[1]:.1f}% of roofline"
        "<br>%{customdata[0]:.4f} ms%{customdata[2]}<extra></extra>",
    )
    # legend entries only (no data): the colour of each kernel, the roofline's line
    kernels = [k for k in KERNEL_COLORS if any(r["kernel"] == k for r in rows)]
    keys = [go.Bar(name=KERNEL_NAMES[k], orientation="h", x=[None], y=[None],
                   marker_color=KERNEL_COLORS[k]) for k in kernels]
    if any(modelled):
        keys.append(go.Bar(name="hatched: modelled; whisker: its 90% error band", x=[None],
                           y=[None], orientation="h",
                           marker=dict(color="#999", pattern=dict(shape="/", fgcolor="white"))))
    roofline = go.Scatter(name=f"copy roofline {roofline_gbps:.0f} GB/s", x=[None], y=[None],
                          mode="lines", line=dict(color="black", dash="dash", width=1))
    fig = go.Figure([bars, *keys, roofline])
    fig.add_vline(x=roofline_gbps, line=dict(color="black", dash="dash", width=1))
    bs = f" block_size={block_size}" if block_size is not None else ""
    auto = ("auto = tuned here, reused from its bucket, or recorded (hover)"
            if "auto" in kernels else "")
    plot_px = BAR_ROW_PX * len(rows)
    fig.update_layout(
        barmode="overlay",
        yaxis=dict(categoryorder="array", categoryarray=names, autorange="reversed",
                   tickfont=dict(size=10), automargin=True),
        xaxis=dict(title="GB/s of K+V read", range=[0, 1.15 * roofline_gbps]),
    )
    return style(
        fig,
        "Decode attention: GB/s of K+V read",
        provenance,
        f"{model} batch={batch} context={context}{bs}; bar text = % of copy roofline",
        note,
        auto,
        # at least `height`, and BAR_ROW_PX a bar beside the title, axis and legend
        height=max(height, plot_px + BANDWIDTH_FRAME_PX),
    )


def prefetch_speedup_figure(
    result_rows: list[dict],
    kernel: str,
    model: str,
    provenance: str,
    block_size: int = 16,
    height: int = 420,
    note: str = "",
) -> go.Figure:
    """Grouped bars: speedup of each prefetch setting over none (ms_none / ms_prefetch) for one
    kernel, model and block size, at every recorded (batch, context) point.

    A dashed line marks 1.0 (no change); the subtitle gives the paper's H20 figure as reference
    and `note` (a line, e.g. how the block size shown differs from the one asked for).
    Raises ValueError if no row matches `kernel`, `model` and `block_size`.
    """
    rows = [
        r
        for r in result_rows
        if r["kernel"] == kernel and r["model"] == model and r["block_size"] == block_size
    ]
    if not rows:
        raise ValueError(
            f"kernel={kernel!r}, model={model!r}, block_size={block_size}: no rows; "
            f"rows have kernels {sorted({r['kernel'] for r in result_rows})} "
            f"and models {sorted({r['model'] for r in result_rows})}"
        )
    pairs = [(r, s) for r, s in speedups(rows) if r["prefetch"] != "none"]  # within one run
    points = sorted({(r["batch"], r["context"]) for r, _ in pairs})
    x = [f"{b} x {c}" for b, c in points]
    settings = list(dict.fromkeys(r["prefetch"] for r, _ in pairs))
    traces = []
    for setting, color in zip(settings, PREFETCH_COLORS * len(settings), strict=False):
        by_point = {(r["batch"], r["context"]): s for r, s in pairs if r["prefetch"] == setting}
        speedup = [by_point.get(p) for p in points]
        traces.append(
            go.Bar(
                name=setting,
                x=x,
                y=speedup,
                marker_color=color,
                text=[f"{s:.2f}x" if s is not None else "" for s in speedup],
                textposition="outside",
                cliponaxis=False,
                hovertemplate=f"{setting}<br>%{{x}}<br>%{{y:.3f}}x over none<extra></extra>",
            )
        )
    fig = go.Figure(traces)
    fig.add_hline(y=1.0, line=dict(color="black", dash="dash", width=1))
    fig.update_layout(
        barmode="group",
        xaxis=dict(title="batch x context (tokens)", automargin=True),
        yaxis=dict(title="ms_none / ms_prefetch", rangemode="tozero"),
        legend_title="prefetch",
    )
    return style(
        fig,
        f"L2 prefetch speedup over none: {kernel}",
        provenance,
        f"{model}, block_size={block_size}; dashed line: 1.0 = no change",
        PAPER_REFERENCE,
        note,
        height=height,
    )


def fp8_speedup_figure(result_rows: list[dict], model: str, provenance: str, height: int = 420,
                       note: str = "") -> go.Figure:
    """Bars: gqa's tokens/s on an fp8 cache over fp16's (ms of kernel "gqa" / ms of "gqa_fp8",
    no prefetch, rows of one loop) for `model` at every (batch, context) with both; dashed lines
    at 1.0 and at 2.0 (half the bytes). Raises ValueError where no point has both rows."""
    pairs = {}
    for r in result_rows:
        if r["model"] == model and r["prefetch"] == "none" and r["kernel"] in ("gqa", "gqa_fp8"):
            pairs.setdefault((r["batch"], r["context"], r.get("loop")), {})[r["kernel"]] = r
    points = sorted((b, c, p["gqa"]["ms"] / p["gqa_fp8"]["ms"], p["gqa_fp8"]["pct_roofline"])
                    for (b, c, _), p in pairs.items() if len(p) == 2)
    if not points:
        raise ValueError(f"model={model!r}: no point with gqa on fp16 and on fp8 in one loop")
    x = [f"{b} x {c}" for b, c, _, _ in points]
    fig = go.Figure(go.Bar(
        x=x, y=[s for _, _, s, _ in points], marker_color=KERNEL_COLORS["gqa_fp8"],
        text=[f"{s:.2f}x" for _, _, s, _ in points], textposition="outside", cliponaxis=False,
        customdata=[p for _, _, _, p in points], showlegend=False,
        hovertemplate="%{x}<br>%{y:.3f}x fp16's tokens/s<br>fp8 reads %{customdata:.1f}% of the "
        "copy roofline<extra></extra>"))
    for y in (1.0, 2.0):
        fig.add_hline(y=y, line=dict(color="black", dash="dash", width=1))
    fig.update_layout(xaxis=dict(title="batch x context (tokens)", automargin=True),
                      yaxis=dict(title="ms on fp16 / ms on fp8", range=[0, 2.3]))
    return style(fig, "fp8 KV cache: gqa's tokens/s over fp16's", provenance,
                 f"{model}, no prefetch, one loop per point; dashed: 1.0 and 2.0 (half the "
                 "bytes)", note, height=height)


def block_order_figure(result_rows: list[dict], model: str, provenance: str, height: int = 420,
                       note: str = "") -> go.Figure:
    """A dot plot for `model` at every (batch, context) timed both ways in one loop (`bench
    attention --in-order`), without prefetch: each family's speed on blocks in order over
    scattered blocks (ms of "<family>" / ms of "<family>_in_order"), and gqa's speed over SDPA's
    on either order; a dashed line at 1.0. Dots, not bars: the ratios sit within a few percent
    of 1.0, which bars from zero would hide. A point timed in several loops shows the first.
    Raises ValueError where no point has both orders."""
    loops = {}
    for r in result_rows:
        if r["model"] == model and r["prefetch"] == "none":
            loops.setdefault((r["batch"], r["context"], r.get("loop")), {})[r["kernel"]] = r
    first = {}  # a point timed in several loops (block sizes, runs) keeps its first
    for (b, c, _), p in loops.items():
        if any(f"{k}_in_order" in p and k in p for k in ("vllm_v1", "gqa")):
            first.setdefault((b, c), p)
    points = [(b, c, first[b, c]) for b, c in sorted(first)]
    if not points:
        raise ValueError(f"model={model!r}: no point with blocks in order and scattered in one "
                         "loop")
    x = [f"{b} x {c}" for b, c, _ in points]

    def ratio(p, slow, fast):
        return p[slow]["ms"] / p[fast]["ms"] if slow in p and fast in p else None

    traces = [go.Scatter(name=f"{family}: in order / scattered", x=x, mode="markers",
                         y=[ratio(p, family, f"{family}_in_order") for _, _, p in points],
                         marker=dict(symbol=symbol, size=10,
                                     color=KERNEL_COLORS[f"{family}_in_order"]),
                         hovertemplate="%{x}<br>%{y:.3f}x on blocks in order<extra></extra>")
              for family, symbol in (("vllm_v1", "square"), ("gqa", "diamond"))]
    traces += [go.Scatter(name=f"gqa / SDPA, {order}", x=x, mode="markers",
                          y=[ratio(p, "sdpa", kernel) for _, _, p in points],
                          marker=dict(symbol=symbol, size=9, color=KERNEL_COLORS["sdpa"]),
                          hovertemplate="%{x}<br>gqa %{y:.3f}x SDPA's speed<extra></extra>")
               for order, kernel, symbol in (("scattered", "gqa", "circle-open"),
                                             ("in order", "gqa_in_order", "circle"))]
    fig = go.Figure(traces)
    fig.add_hline(y=1.0, line=dict(color="black", dash="dash", width=1))
    fig.update_layout(xaxis=dict(title="batch x context (tokens)", automargin=True),
                      yaxis=dict(title="speed ratio"))
    return style(fig, "Blocks in order: speed over blocks scattered through the pool",
                 provenance, f"{model}, no prefetch, one loop per point; dashed: 1.0", note,
                 height=height)


def mixed_figure(result_rows: list[dict], model: str, lengths: str, provenance: str,
                 height: int = 420, note: str = "") -> go.Figure:
    """Grouped bars: % of the copy roofline of each kernel without prefetch (gqa, gqa planned as
    if every sequence were the longest, vllm_v1, and where timed a plain read of the batch's
    bytes) on `model`'s batches of `lengths` (a spec such
    as "lognormal:3200,16384", the rows' `lengths`), one group per batch; a dashed line at the
    roofline. Raises ValueError where `model` has no rows of those lengths."""
    rows = [r for r in result_rows if r["model"] == model and r.get("lengths") == lengths
            and r["prefetch"] == "none"]
    if not rows:
        raise ValueError(f"model={model!r}: no rows of lengths {lengths!r}")
    batches = sorted({r["batch"] for r in rows})
    kernels = [k for k in KERNEL_COLORS if any(r["kernel"] == k for r in rows)]
    first, shape = {}, {}
    for r in rows:  # a setting measured in several loops keeps its first row
        first.setdefault((r["batch"], r["kernel"]), r)
        shape.setdefault(r["batch"], r)  # the batch's lengths: mean and longest
    x = [f"{b} x ~{shape[b]['context']} (max {shape[b]['max_context']})" for b in batches]
    fig = go.Figure([
        go.Bar(name=KERNEL_NAMES[k], x=x, marker_color=KERNEL_COLORS[k],
               y=[first[b, k]["pct_roofline"] if (b, k) in first else None for b in batches],
               text=[f"{first[b, k]['pct_roofline']:.0f}%" if (b, k) in first else ""
                     for b in batches],
               textposition="outside", cliponaxis=False,
               hovertemplate=f"{k}<br>%{{x}}<br>%{{y:.1f}}% of the copy roofline<extra></extra>")
        for k in kernels])
    fig.add_hline(y=100, line=dict(color="black", dash="dash", width=1))
    fig.update_layout(barmode="group",
                      xaxis=dict(title="batch x mean length (longest), tokens", automargin=True),
                      yaxis=dict(title="% of the copy roofline", range=[0, 125]))
    return style(fig, "Mixed lengths: % of the copy roofline by batch", provenance,
                 f"{model}, {lengths} (lognormal: mean before clipping, clip); no prefetch, "
                 "one loop per batch; dashed: the roofline", note, height=height)


def gpu_speedup_figure(speedups: dict[str, dict[str, float | None]], detail: str,
                       provenance: str, height: int = 420, note: str = "") -> go.Figure:
    """A heatmap of prefetch speedups: one row per GPU (the keys of `speedups`, drawn top down),
    one column per point (the keys of each row, e.g. "16 x 4096"), each cell's speedup written
    in it and coloured from red (slower) through white (1.0) to green (faster); None: a
    setting the GPU cannot run, left blank. `detail`: what the speedups are of (model, family,
    prefetch). Raises ValueError where `speedups` is empty or its rows name different points."""
    check_height(height)
    if not speedups:
        raise ValueError("speedups is empty: need one row of speedups a GPU")
    columns = list(next(iter(speedups.values())))
    for gpu, row in speedups.items():
        if list(row) != columns:
            raise ValueError(f"speedups[{gpu!r}] has points {list(row)}: must have {columns}")
    gpus = list(speedups)
    z = [[speedups[g][c] for c in columns] for g in gpus]
    values = [v for row in z for v in row if v is not None]
    reach = max([abs(v - 1) for v in values] + [0.05])  # colour scale symmetric about 1.0
    fig = go.Figure(go.Heatmap(
        z=z, x=columns, y=gpus, zmin=1 - reach, zmax=1 + reach, zmid=1.0,
        colorscale=[[0, "#d62728"], [0.5, "#ffffff"], [1, "#2ca02c"]],
        text=[["" if v is None else f"{v:.2f}x" for v in row] for row in z],
        texttemplate="%{text}", hoverongaps=False,
        colorbar=dict(title="speedup", thickness=12),
        hovertemplate="%{y}<br>%{x}<br>%{z:.3f}x over none<extra></extra>"))
    fig.update_layout(xaxis=dict(title="batch x context (tokens)", type="category"),
                      yaxis=dict(autorange="reversed", type="category", automargin=True))
    return style(fig, "Would L2 prefetch pay? Speedup over none, by GPU", provenance, detail,
                 note, height=max(height, 24 * len(gpus) + 200))

