"""Cache figures: the numbers drawn are the accounting's numbers; provenance says 'computed'."""

import json

import numpy as np
import plotly.io as pio
import pytest

from kvlab.cache.accounting import fragmentation_sweep, memory_report, replay_block_tables
from kvlab.viz.cache import GIB, block_table_figure, fragmentation_figure, memory_figure
from kvlab.workload import make_workload

BYTES_PER_TOKEN = 131072


def chat_workload(shared_fraction=0.5):
    return make_workload("chat (lognormal)", 120, 4096, shared_fraction, prefix_len=300)


def assert_provenance(fig):
    text = json.dumps(fig.to_plotly_json(), default=str).lower()
    assert "computed" in text and "measured" not in text
    assert fig.layout.height and fig.layout.title.text


def test_memory_figure_draws_the_report():
    report = memory_report(chat_workload(), BYTES_PER_TOKEN, 16, budget_bytes=4 * GIB)
    fig = memory_figure(report)
    paged_reserved, paged_holding, contiguous_reserved, contiguous_holding = fig.data
    assert [t.name for t in fig.data] == ["paged reserved", "paged holding tokens",
                                          "contiguous reserved", "contiguous holding tokens"]
    assert paged_reserved.y == pytest.approx([report.paged.reserved_bytes / GIB])
    assert contiguous_reserved.y == pytest.approx([report.contiguous.reserved_bytes / GIB])
    assert paged_holding.y == pytest.approx([report.paged.token_bytes / GIB])
    assert contiguous_holding.y == pytest.approx([report.contiguous.token_bytes / GIB])
    assert contiguous_reserved.marker.color == "#d62728"  # the red bars are in the legend
    assert all(t.showlegend is not False for t in fig.data)
    assert f"fragmentation {report.paged.fragmentation_pct:.1f}%" in paged_reserved.x[0]
    assert f"fragmentation {report.contiguous.fragmentation_pct:.1f}%" in contiguous_holding.x[0]
    assert [s.y0 for s in fig.layout.shapes] == [4.0]
    title = fig.layout.title.text
    assert f"paged {report.paged.num_requests_fit} / 120" in title
    assert f"contiguous {report.contiguous.num_requests_fit} / 120 requests" in title
    assert_provenance(fig)


def test_memory_figure_without_budget_has_no_budget_line():
    fig = memory_figure(memory_report(chat_workload(), BYTES_PER_TOKEN, 16))
    assert fig.layout.shapes == ()
    assert "budget" not in fig.layout.title.text


def test_fragmentation_figure_draws_the_sweep_and_marks_block_size():
    sweep = fragmentation_sweep(chat_workload(), BYTES_PER_TOKEN)
    fig = fragmentation_figure(sweep, 64)
    paged, contiguous, reserved, current = fig.data
    assert list(paged.x) == sweep.block_sizes.tolist()
    assert np.allclose(paged.y, sweep.fragmentation_pct)
    assert np.allclose(contiguous.y, sweep.contiguous.fragmentation_pct)
    assert np.allclose(reserved.y, sweep.reserved_bytes / GIB) and reserved.yaxis == "y2"
    k = sweep.block_sizes.tolist().index(64)
    assert list(current.x) == [64] and current.y[0] == pytest.approx(sweep.fragmentation_pct[k])
    assert fig.layout.xaxis.type == "log"
    assert_provenance(fig)
    with pytest.raises(ValueError, match=r"block_size=48: must be one of the swept sizes"):
        fragmentation_figure(sweep, 48)


def grid(values) -> np.ndarray:
    """A heatmap's z or customdata as floats, its gaps (None) as NaN."""
    return np.array(values, dtype=float)


def test_block_table_figure_draws_tables_tokens_and_shared_blocks():
    block_tables = [[0, 1, 2], [0, 1, 3, 4], [5]]
    seq_lens = [10, 13, 2]
    fig = block_table_figure(block_tables, seq_lens, block_size=4)
    private, shared = fig.data
    z = np.fmax(grid(private.z), grid(shared.z))
    assert z.shape == (3, 4)
    assert np.array_equal(z[1], [0, 1, 3, 4]) and np.isnan(z[0, 3]) and np.isnan(z[2, 1:]).all()
    customdata = grid(private.customdata)
    tokens, ref_cnts = customdata[..., 1], customdata[..., 2]
    assert tokens[0, :3].tolist() == [4, 4, 2] and tokens[1].tolist() == [4, 4, 4, 1]
    assert ref_cnts[0, :3].tolist() == [2, 2, 1]
    # Blocks 0 and 1, held by requests 0 and 1, are exactly the cells of the shared trace.
    assert np.argwhere(~np.isnan(grid(shared.z))).tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert np.isnan(grid(private.z)[:2, :2]).all()
    # gaps are NaN in numpy arrays, which Plotly sends as typed arrays: no NaN literal in its JSON
    text = pio.to_json(fig, validate=True, engine="json")
    assert "NaN" not in text and '"bdata"' in text
    assert "ref_cnt" in private.hovertemplate and "physical block" in private.hovertemplate
    assert_provenance(fig)


def test_block_table_figure_of_a_replayed_shared_prefix_workload():
    workload = chat_workload(shared_fraction=1.0)
    block_tables, seq_lens = replay_block_tables(workload, 16, max_requests=20)
    fig = block_table_figure(block_tables, seq_lens, 16)
    private, shared = fig.data
    assert grid(private.z).shape == (20, max(map(len, block_tables)))
    # Two prefix groups of 300 tokens: 18 full blocks shared by every request of each group.
    groups = workload.prefix_group[:20]
    group_sizes = [int((groups == g).sum()) for g in (0, 1)]
    num_shared_cells = int((~np.isnan(grid(shared.z))).sum())
    assert num_shared_cells == 300 // 16 * sum(n for n in group_sizes if n > 1)


def test_block_table_figure_truncates_columns_and_checks_lengths():
    fig = block_table_figure([list(range(100))], [100], block_size=1, max_blocks=10)
    assert grid(fig.data[0].z).shape == (1, 10) and "first 10 blocks" in fig.layout.title.text
    empty = block_table_figure([], [], block_size=16)
    assert grid(empty.data[0].z).size == 0
    with pytest.raises(ValueError, match=r"seq_lens has 1 entries: must match block_tables \(2\)"):
        block_table_figure([[0], [1]], [3], block_size=4)
