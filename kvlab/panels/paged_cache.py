"""The "Paged cache" tab: how block size, request lengths and shared prefixes set KV memory.

Wiring only: the controls feed `kvlab.workload.make_workload`, `kvlab.cache.accounting` and
`kvlab.viz.cache`; every change recomputes all three figures.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from kvlab.cache.accounting import (
    BLOCK_SIZES,
    fragmentation_sweep,
    memory_report,
    replay_block_tables,
)
from kvlab.checks import check_int, check_positive_int
from kvlab.config import MODELS
from kvlab.panels.widgets import control_grid, figure_widget, labeled, show_figure
from kvlab.viz.cache import GIB, block_table_figure, fragmentation_figure, memory_figure
from kvlab.workload import DISTRIBUTIONS, make_workload

KV_DTYPE_BYTES = 2  # fp16 / bf16 K and V
NUM_PREFIXES = 2  # distinct shared system prompts
FIGURE_HEIGHTS = {"memory": 420, "fragmentation": 420, "block_table": 520}


def _controls(
    model: str,
    block_size: int,
    num_requests: int,
    distribution: str,
    shared_fraction: float,
    prefix_len: int,
    budget_gib: float,
) -> dict[str, widgets.Widget]:
    slider = {"continuous_update": False}
    return {
        "model": labeled(widgets.Dropdown, "model", name="model", options=list(MODELS),
                         value=model),
        "block_size": labeled(
            widgets.SelectionSlider,
            "block_size (tokens)",
            name="block_size",
            options=list(BLOCK_SIZES),
            value=block_size,
            **slider,
        ),
        "num_requests": labeled(
            widgets.IntSlider, "num requests", name="num_requests", min=1, max=1000,
            value=num_requests, **slider
        ),
        "distribution": labeled(
            widgets.Dropdown, "length distribution", name="distribution",
            options=list(DISTRIBUTIONS), value=distribution
        ),
        "shared_fraction": labeled(
            widgets.FloatSlider,
            "shared-prefix fraction",
            name="shared_fraction",
            min=0.0,
            max=1.0,
            step=0.05,
            value=shared_fraction,
            **slider,
        ),
        "prefix_len": labeled(
            widgets.IntSlider,
            "prefix_len (tokens)",
            name="prefix_len",
            min=0,
            max=MODELS[model].max_position // 2,
            value=prefix_len,
            **slider,
        ),
        "budget_gib": labeled(
            widgets.FloatSlider,
            "KV budget (GiB)",
            name="budget_gib",
            min=0.5,
            max=160.0,
            step=0.5,
            value=budget_gib,
            **slider,
        ),
    }


class PagedCacheTab:
    """Paged vs contiguous KV memory for a synthetic workload at its final lengths.

    controls: model, block_size, num_requests, distribution, shared_fraction, prefix_len
        (disabled while shared_fraction is 0), budget_gib. figures: memory, fragmentation,
        block_table (`FigurePane`s).
    The block-table figure replays the first `num_table_requests` requests through BlockManager.
    Raises ValueError naming a parameter whose value its control does not offer (or for
    `num_table_requests` not a positive integer, `seed` not an integer >= 0).
    """

    key = "paged_cache"
    title = "Paged cache"

    def __init__(
        self,
        model: str = "llama3-8b",
        block_size: int = 16,
        num_requests: int = 256,
        distribution: str = "chat (lognormal)",
        shared_fraction: float = 0.0,
        prefix_len: int = 1000,
        budget_gib: float = 40.0,
        num_table_requests: int = 24,
        seed: int = 0,
    ):
        check_positive_int("num_table_requests", num_table_requests)
        check_int("seed", seed, 0)
        self.num_table_requests = num_table_requests
        self.seed = seed
        self.controls = _controls(
            model, block_size, num_requests, distribution, shared_fraction, prefix_len, budget_gib
        )
        self.figures = {name: figure_widget(h) for name, h in FIGURE_HEIGHTS.items()}
        self.status = widgets.HTML()
        # NOTE: registered before refresh, so prefix_len's range follows the model first.
        self.controls["model"].observe(self._on_model, names="value")
        for control in self.controls.values():
            control.observe(self.refresh, names="value")
        self.widget = self._layout()
        self.refresh()

    def _layout(self) -> widgets.Widget:
        c = self.controls
        order = ("model", "distribution", "num_requests", "block_size", "budget_gib",
                 "shared_fraction", "prefix_len")
        return widgets.VBox([control_grid([c[name] for name in order]), self.status,
                             *self.figures.values()])

    def _on_model(self, change) -> None:
        self.controls["prefix_len"].max = MODELS[change["new"]].max_position // 2

    def refresh(self, change=None) -> None:
        """Recompute the workload, the accounting and all figures from the controls."""
        v = {name: control.value for name, control in self.controls.items()}
        # the shared prefix's length matters only where requests share it
        self.controls["prefix_len"].disabled = v["shared_fraction"] == 0
        model = MODELS[v["model"]]
        bytes_per_token = model.kv_bytes_per_token(KV_DTYPE_BYTES)
        try:
            workload = make_workload(
                v["distribution"],
                v["num_requests"],
                model.max_position,
                v["shared_fraction"],
                v["prefix_len"],
                NUM_PREFIXES,
                seed=self.seed,
            )
        except ValueError as error:
            self.status.value = f"<span style='color:#d62728'>{html.escape(str(error))}</span>"
            return
        report = memory_report(
            workload, bytes_per_token, v["block_size"], budget_bytes=int(v["budget_gib"] * GIB)
        )
        sweep = fragmentation_sweep(workload, bytes_per_token)
        block_tables, seq_lens = replay_block_tables(
            workload, v["block_size"], self.num_table_requests
        )
        self.status.value = (
            f"{html.escape(model.name)}: {bytes_per_token // 1024} KiB of K+V per token "
            f"({model.num_layers} layers, {model.num_kv_heads} KV heads x {model.head_dim}, "
            f"{KV_DTYPE_BYTES}-byte dtype); max_seq_len={workload.max_seq_len}; "
            f"workload: {html.escape(workload.name)}"
        )
        show_figure(self.figures["memory"], memory_figure(report, FIGURE_HEIGHTS["memory"]))
        show_figure(
            self.figures["fragmentation"],
            fragmentation_figure(sweep, v["block_size"], FIGURE_HEIGHTS["fragmentation"]),
        )
        show_figure(
            self.figures["block_table"],
            block_table_figure(
                block_tables, seq_lens, v["block_size"], height=FIGURE_HEIGHTS["block_table"]
            ),
        )
