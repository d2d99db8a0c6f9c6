"""The regime map: where L2 prefetch pays, by SM count, GQA group and batch x context.

From the rows of `python -m kvlab bench attention --sms ...` (each loop times one point, block
size and SM count): per family, the best prefetch setting's speedup over no prefetch in the same
loop (`kvlab.results.speedups`), laid out as a heatmap of SM count against the point.
"""

from __future__ import annotations

import plotly.graph_objects as go

from kvlab.results import speedups
from kvlab.viz.layout import style

__all__ = ["regime_cells", "regime_figure"]


def regime_cells(rows: list[dict], kernel: str, block_size: int = 16) -> list[dict]:
    """One cell per (SM count, model, batch, context) where `kernel` was timed with and without
    prefetch at `block_size`: {"sms", "model", "group", "batch", "context", "tokens", "speedup",
    "prefetch"} with the best setting's speedup (ms_none / ms_prefetch, same loop) and its label.
    Rows without "sms" were timed on the whole GPU: their cells have sms None."""
    best = {}
    for row, speedup in speedups([r for r in rows if r["kernel"] == kernel
                                  and r["block_size"] == block_size]):
        if row["prefetch"] == "none":
            continue
        key = (row.get("sms"), row["model"], row["batch"], row["context"])
        if key not in best or speedup > best[key]["speedup"]:
            best[key] = {"sms": row.get("sms"), "model": row["model"],
                         "group": row["num_qo_heads"] // row["num_kv_heads"],
                         "batch": row["batch"], "context": row["context"],
                         "tokens": row["batch"] * row["context"], "speedup": speedup,
                         "prefetch": row["prefetch"]}
    return list(best.values())


def _tokens(n: int) -> str:
    """A context length for a tick label: "4k" for 4096, as is where not a multiple of 1024."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def regime_figure(rows: list[dict], kernel: str, provenance: str, block_size: int = 16,
                  height: int = 420) -> go.Figure:
    """Heatmap: the best prefetch setting's speedup over none for `kernel`, one row per SM count
    (fewest at the bottom), one column per (model, batch x context), ordered by GQA group, then
    tokens. Color diverges at 1.0 (red: prefetch pays; blue: it loses). Raises ValueError when
    no row of `kernel` at `block_size` has a prefetch setting and its no-prefetch twin."""
    cells = regime_cells(rows, kernel, block_size)
    if not cells:
        raise ValueError(f"kernel={kernel!r}, block_size={block_size}: no loop with prefetch and "
                         "no prefetch timed together")
    columns = sorted({(c["group"], c["tokens"], c["model"], c["batch"], c["context"])
                      for c in cells})
    sms = sorted({c["sms"] for c in cells}, key=lambda n: (n is not None, n or 0))
    at = {(c["sms"], c["model"], c["batch"], c["context"]): c for c in cells}
    z, text, best = [], [], []  # best: the best setting of each cell, for the hover
    for n in sms:
        found = [at.get((n, model, b, ctx)) for _, _, model, b, ctx in columns]
        z.append([c["speedup"] if c else None for c in found])
        text.append([f"{c['speedup']:.2f}" if c else "" for c in found])
        best.append([c["prefetch"] if c else "" for c in found])
    x = [f"{model} ({group}:1) {b} x {_tokens(ctx)}" for group, _, model, b, ctx in columns]
    y = ["whole GPU" if n is None else f"{n} SMs" for n in sms]
    spread = max(abs(v - 1) for row in z for v in row if v is not None) or 0.01
    fig = go.Figure(go.Heatmap(
        z=z, x=x, y=y, text=text, texttemplate="%{text}", customdata=best, zmid=1.0,
        zmin=1 - spread, zmax=1 + spread, colorscale="RdBu_r",
        colorbar=dict(title="speedup"),
        hovertemplate="%{y}, %{x}<br>%{z:.3f}x over no prefetch with %{customdata}"
                      "<extra></extra>"))
    # NOTE: one line a column, upright: some 15 px a column on a 500 px chart, where labels of two
    # lines, or turned by Plotly only once they collide, overlap their neighbours
    fig.update_layout(xaxis=dict(title="model (GQA group), batch x context", tickangle=-90,
                                 tickfont=dict(size=11)),
                      yaxis=dict(title="SMs"))
    return style(fig, f"Where L2 prefetch pays: {kernel}", provenance,
                 f"block_size={block_size}; best setting over none, same-loop ratios",
                 height=height)
