"""Figures of KV cache memory: paged vs contiguous, fragmentation vs block size, block tables.

Plain functions from accounting results (`kvlab.cache.accounting`) to `plotly.graph_objects.Figure`.
Every number drawn here is computed from block arithmetic, not read from a GPU; each figure says so.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from kvlab.cache.accounting import FragmentationSweep, MemoryReport
from kvlab.checks import check_block_size, check_positive_int
from kvlab.viz.layout import check_height, style

__all__ = ["block_table_figure", "fragmentation_figure", "memory_figure"]

GIB = 2**30
PROVENANCE = "computed exactly from block accounting (no GPU involved)"
PAGED_COLOR, CONTIGUOUS_COLOR, SHARED_COLOR = "#1f77b4", "#d62728", "#d62728"
PAGED_LIGHT, CONTIGUOUS_LIGHT = "#aec7e8", "#ff9896"  # memory holding tokens


def _fits(num_fit: int | None, num_requests: int) -> str:
    return f"{num_fit} / {num_requests}" if num_fit is not None else ""


def memory_figure(report: MemoryReport, height: int = 380) -> go.Figure:
    """Grouped bars, GiB: memory reserved vs memory holding tokens, paged vs contiguous.

    One trace per scheme (blue paged, red contiguous) and kind (dark: reserved, light: holding
    tokens), so the legend names every colour. The category labels give each scheme's internal
    fragmentation; with a budget, a dashed line marks it and the subtitle and hover text say how
    many requests (in order) fit in it.
    """
    paged, contiguous = report.paged, report.contiguous
    x = [
        f"paged, block_size={report.block_size}<br>fragmentation {paged.fragmentation_pct:.1f}%",
        f"contiguous, max_seq_len={report.max_seq_len}"
        f"<br>fragmentation {contiguous.fragmentation_pct:.1f}%",
    ]
    fits = [_fits(u.num_requests_fit, report.num_requests) for u in (paged, contiguous)]
    traces = []
    # one trace per scheme and kind, so the legend names every colour; offsetgroup keeps the
    # reserved bars left of the holding-tokens bars in both categories
    for name, usage, category, fit, colors in (
        ("paged", paged, x[0], fits[0], (PAGED_COLOR, PAGED_LIGHT)),
        ("contiguous", contiguous, x[1], fits[1], (CONTIGUOUS_COLOR, CONTIGUOUS_LIGHT)),
    ):
        traces.append(go.Bar(
            name=f"{name} reserved", x=[category], y=[usage.reserved_bytes / GIB],
            customdata=[fit], marker_color=colors[0], offsetgroup="reserved",
            hovertemplate="%{x}<br>reserved %{y:.3f} GiB<br>%{customdata} requests fit"
            "<extra></extra>",
        ))
        traces.append(go.Bar(
            name=f"{name} holding tokens", x=[category], y=[usage.token_bytes / GIB],
            marker_color=colors[1], offsetgroup="holding",
            hovertemplate="%{x}<br>holding tokens %{y:.3f} GiB<extra></extra>",
        ))
    fig = go.Figure(traces)
    budget = ""
    if report.budget_bytes is not None:
        budget_gib = report.budget_bytes / GIB
        fig.add_hline(
            y=budget_gib,
            line=dict(color="black", dash="dash", width=1),
            annotation_text=f"budget {budget_gib:.1f} GiB",
            annotation_position="top right",
        )
        budget = (f"budget {budget_gib:.1f} GiB; fit: paged {fits[0]}, "
                  f"contiguous {fits[1]} requests")
    fig.update_layout(barmode="group", yaxis_title="GiB")
    return style(
        fig,
        "KV memory: paged vs contiguous",
        PROVENANCE,
        f"{report.num_requests} requests at full length",
        budget,
        height=height,
        legend_y=-0.25,
    )


def fragmentation_figure(
    sweep: FragmentationSweep, block_size: int, height: int = 380
) -> go.Figure:
    """Paged internal fragmentation (%) and reserved GiB vs block size; `block_size` marked.

    The contiguous cache's fragmentation, which no block size changes, is a dashed reference line.
    Raises ValueError if `block_size` is not one of `sweep.block_sizes`.
    """
    sizes = sweep.block_sizes.tolist()
    if block_size not in sizes:
        raise ValueError(f"block_size={block_size!r}: must be one of the swept sizes {sizes}")
    k = sizes.index(block_size)
    frag = sweep.fragmentation_pct
    contiguous_frag = sweep.contiguous.fragmentation_pct
    traces = [
        go.Scatter(
            name="paged fragmentation",
            x=sizes,
            y=frag,
            mode="lines+markers",
            line_color=PAGED_COLOR,
            hovertemplate="block_size %{x}<br>%{y:.2f}%<extra></extra>",
        ),
        go.Scatter(
            name="contiguous fragmentation",
            x=[sizes[0], sizes[-1]],
            y=[contiguous_frag, contiguous_frag],
            mode="lines",
            line=dict(color=CONTIGUOUS_COLOR, dash="dash"),
            hovertemplate="contiguous %{y:.2f}%<extra></extra>",
        ),
        go.Scatter(
            name="paged reserved (GiB)",
            x=sizes,
            y=sweep.reserved_bytes / GIB,
            yaxis="y2",
            mode="lines",
            line=dict(color="gray", dash="dot"),
            hovertemplate="block_size %{x}<br>reserved %{y:.3f} GiB<extra></extra>",
        ),
        go.Scatter(
            name=f"block_size={block_size}",
            x=[block_size],
            y=[frag[k]],
            mode="markers",
            marker=dict(size=14, symbol="diamond", color=PAGED_COLOR, line_width=2),
            hovertemplate="block_size %{x}<br>fragmentation %{y:.2f}%<extra></extra>",
        ),
    ]
    fig = go.Figure(traces)
    fig.update_layout(
        xaxis=dict(
            title="block_size (tokens, log2 scale)", type="log", tickvals=sizes, ticktext=sizes
        ),
        yaxis=dict(title="internal fragmentation (%)", rangemode="tozero"),
        yaxis2=dict(
            title="paged reserved (GiB)",
            overlaying="y",
            side="right",
            rangemode="tozero",
            showgrid=False,
            tickmode="auto",
        ),
    )
    return style(
        fig,
        "Internal fragmentation vs block size",
        PROVENANCE,
        f"at block_size={block_size}: {frag[k]:.2f}%; contiguous: {contiguous_frag:.1f}%",
        height=height,
        legend_y=-0.3,
    )


def _grid(block_tables: list[list[int]], seq_lens: list[int], block_size: int, num_cols: int):
    """[num_rows, num_cols] physical block ids (NaN = no block), tokens per block, ref counts."""
    num_rows = len(block_tables)
    block_ids = np.full((num_rows, num_cols), np.nan)
    tokens = np.zeros((num_rows, num_cols))
    for row, (table, seq_len) in enumerate(zip(block_tables, seq_lens, strict=True)):
        table = table[:num_cols]
        block_ids[row, : len(table)] = table
        tokens[row, : len(table)] = np.clip(
            seq_len - block_size * np.arange(len(table)), 0, block_size
        )
    all_ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in block_tables] or [np.zeros(0)])
    ids, counts = np.unique(all_ids, return_counts=True)
    valid = ~np.isnan(block_ids)
    ref_cnts = np.zeros((num_rows, num_cols))
    ref_cnts[valid] = counts[np.searchsorted(ids, block_ids[valid])]
    return block_ids, tokens, ref_cnts


def block_table_figure(
    block_tables: list[list[int]],
    seq_lens: list[int],
    block_size: int,
    max_blocks: int = 512,
    height: int | None = None,
) -> go.Figure:
    """Heatmap of block tables: row = request, column = logical block, color = physical block id.

    Args:
        block_tables: per request, physical block ids in logical order (e.g. from
            `kvlab.cache.accounting.replay_block_tables`).
        seq_lens: per request, its token count (`len(seq_lens) == len(block_tables)`).
        block_size: tokens per block (a power of two in [1, 256]).
        max_blocks: at most this many logical blocks (columns) are drawn (>= 1).
        height: figure height in pixels (in [10, 100000]); default grows with the number of
            requests.

    Blocks held by more than one request (ref count > 1: a shared prefix) are drawn in red, in a
    second heatmap trace; private blocks are colored by physical block id.
    Hover shows request, logical block, physical block, tokens in the block and its ref count.
    Raises ValueError if `seq_lens` and `block_tables` differ in length, or for a `block_size`,
    `max_blocks` or `height` outside what is allowed above.
    """
    check_block_size(block_size)
    check_positive_int("max_blocks", max_blocks)
    if height is not None:
        check_height(height)
    if len(seq_lens) != len(block_tables):
        raise ValueError(
            f"seq_lens has {len(seq_lens)} entries: must match block_tables ({len(block_tables)})"
        )
    num_cols = min(max(map(len, block_tables), default=0), max_blocks)
    block_ids, tokens, ref_cnts = _grid(block_tables, seq_lens, block_size, num_cols)
    hover = (
        "request %{y}<br>logical block %{x}<br>physical block %{customdata[0]}"
        f"<br>tokens %{{customdata[1]}} / {block_size}<br>ref_cnt %{{customdata[2]}}<extra></extra>"
    )
    # NOTE: numpy arrays, which Plotly sends as typed arrays (base64): a gap is a NaN there, and
    # no NaN literal reaches the JSON; nested lists would also cost Plotly's validation ~40x more.
    customdata = np.stack([np.nan_to_num(block_ids, nan=-1), tokens, ref_cnts],
                          axis=-1).astype(np.int64)  # [rows, cols, 3]; gaps are never hovered
    shared = ref_cnts > 1
    private_blocks = go.Heatmap(
        name="private block",
        z=np.where(shared, np.nan, block_ids),
        customdata=customdata,
        hoverongaps=False,
        colorscale="Viridis",
        colorbar=dict(title="physical<br>block id"),
        hovertemplate=hover,
    )
    shared_blocks = go.Heatmap(
        name="shared block (ref_cnt > 1)",
        z=np.where(shared, block_ids, np.nan),
        customdata=customdata,
        hoverongaps=False,
        colorscale=[[0.0, SHARED_COLOR], [1.0, SHARED_COLOR]],
        showscale=False,
        showlegend=True,
        hovertemplate=hover,
    )
    fig = go.Figure([private_blocks, shared_blocks])
    num_shown = (
        "" if num_cols == max(map(len, block_tables), default=0) else f", first {num_cols} blocks"
    )
    fig.update_layout(
        xaxis_title="logical block index",
        yaxis=dict(title="request", autorange="reversed"),
        plot_bgcolor="white",
    )
    return style(
        fig,
        f"Block tables of the first {len(block_tables)} requests",
        PROVENANCE,
        f"block_size={block_size}{num_shown}; color = physical block id, red = shared",
        height=height if height is not None else int(np.clip(140 + 16 * len(block_tables), 320,
                                                             900)),
        legend_y=-0.12,
    )
