"""kernel="auto" picks the prefetch setting that was fastest in the recorded benchmark (CPU)."""

import pytest

from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.kernels.select import best_prefetch, recorded_rows
from kvlab.results import speedups


def fastest(kernel, model, batch, context, block_size):
    """The setting with the largest gain over no prefetch measured in the same run (the smallest
    such gain when several runs measured it)."""
    point = (kernel, model, batch, context, block_size)
    rows = [r for r in recorded_rows()
            if (r["kernel"], r["model"], r["batch"], r["context"], r["block_size"]) == point]
    gains = {}
    for row, gain in speedups(rows):
        gains[row["prefetch"]] = min(gain, gains.get(row["prefetch"], gain))
    best = max(gains, key=gains.get)
    return best if gains[best] > 1 else "none"


@pytest.mark.parametrize(
    ("kernel", "heads", "block_size", "batch", "context", "model"),
    [
        ("vllm_v1", (40, 8), 16, 16, 1024, "qwen2.5-14b"),  # prefetch won here
        ("vllm_v1", (32, 32), 16, 64, 8192, "llama2-7b"),  # and lost here
        ("vllm_v1", (28, 4), 32, 16, 32768, "qwen2.5-7b"),
        ("gqa", (32, 8), 128, 128, 32768, "llama3-8b"),
    ],
)
def test_recorded_point_gets_its_fastest_setting(kernel, heads, block_size, batch, context, model):
    got = best_prefetch(kernel, *heads, block_size, batch, context)
    assert got.label() == fastest(kernel, model, batch, context, block_size)


def test_off_the_grid_a_setting_must_win_at_every_recorded_point_around():
    # qwen2.5-14b, vllm_v1, block 16: prefetch won at batch 16 x 1k but lost at batch 64, so at
    # batch 32 x 1k (between them) auto takes none.
    assert fastest("vllm_v1", "qwen2.5-14b", 16, 1024, 16) != "none"
    assert fastest("vllm_v1", "qwen2.5-14b", 64, 1024, 16) == "none"
    assert best_prefetch("vllm_v1", 40, 8, 16, 32, 1024) == PrefetchConfig()


def test_nearest_recorded_shape_is_used():
    # 64:8 is group 8: the nearest recorded group is qwen2.5-7b's 7; 128 x 8192 is recorded
    got = best_prefetch("vllm_v1", 64, 8, 16, 128, 8192)
    assert got.label() == fastest("vllm_v1", "qwen2.5-7b", 128, 8192, 16)


def test_unrecorded_kernel_gets_no_prefetch():
    assert best_prefetch("flash", 32, 8, 16, 1, 1024) == PrefetchConfig()


@pytest.mark.parametrize(("batch", "context"), [(1, 40), (512, 2**20), (1, 2**20), (512, 40)])
def test_shapes_outside_the_recorded_grid_take_its_edge(batch, context):
    edge = best_prefetch("gqa", 32, 8, 16, min(max(batch, 1), 128), min(max(context, 1024), 32768))
    assert best_prefetch("gqa", 32, 8, 16, batch, context) == edge
