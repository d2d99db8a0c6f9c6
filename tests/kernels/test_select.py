"""kernel="auto" without measuring takes the recorded prefetch setting with the best worst-case
gain around the shape: known answers on a small recorded grid written here (CPU)."""

import pytest

from kvlab.kernels import select
from kvlab.kernels.prefetch import PrefetchConfig

BULK, LINE = "bulk K+V d=1", "line K+V d=2"
# (batch, context) -> ms of none, bulk, line for vllm_v1 on a 32:8 model at block 16:
# bulk wins big at batch 16 but loses at batch 64; line wins a little at both.
GQA_MS = {(16, 1024): (10.0, 8.0, 9.0), (64, 1024): (10.0, 10.5, 9.8),
          (16, 8192): (10.0, 8.0, 9.0), (64, 8192): (10.0, 10.5, 9.8)}


def rows_of(model, heads, block_size, ms_by_point, source="a", kernel="vllm_v1"):
    return [{"kernel": kernel, "model": model, "num_qo_heads": heads[0], "num_kv_heads": heads[1],
             "block_size": block_size, "batch": b, "context": c, "prefetch": label, "ms": ms,
             "source": source}
            for (b, c), times in ms_by_point.items()
            for label, ms in zip(("none", BULK, LINE), times, strict=True)]


@pytest.fixture
def recorded(monkeypatch):
    rows = [*rows_of("gqa4", (32, 8), 16, GQA_MS),
            # multi-head attention: prefetch only loses
            *rows_of("mha", (32, 32), 16, {(16, 1024): (10.0, 11.0, 10.5)})]
    monkeypatch.setattr(select, "recorded_rows", lambda: tuple(rows))
    return rows


@pytest.mark.parametrize(
    ("heads", "batch", "context", "expected"),
    [
        ((32, 8), 16, 1024, BULK),  # recorded here: bulk's 1.25x
        ((32, 8), 64, 1024, LINE),  # bulk loses here, line gains 1.02x
        ((32, 8), 32, 1024, LINE),  # between 16 and 64: bulk's worst case is a loss
        ((32, 8), 16, 4096, BULK),  # between two contexts where bulk won both
        ((32, 8), 512, 2**20, LINE),  # past the grid: its corner (64, 8192)
        ((32, 32), 16, 1024, "none"),  # MHA: nothing gains
        ((64, 8), 16, 1024, BULK),  # group 8: the nearest recorded group is 4, not 1
        ((40, 40), 16, 1024, "none"),  # group 1: the MHA model
    ],
)
def test_known_answers(recorded, heads, batch, context, expected):
    got = select.best_prefetch("vllm_v1", *heads, 16, batch, context)
    assert got == PrefetchConfig.from_label(expected)


def test_the_nearest_recorded_block_size_stands_in(recorded):
    assert select.best_prefetch("vllm_v1", 32, 8, 32, 16, 1024) == PrefetchConfig.from_label(BULK)


def test_a_setting_recorded_twice_counts_with_its_smaller_gain(recorded, monkeypatch):
    again = rows_of("gqa4", (32, 8), 16, {(16, 1024): (10.0, 11.0, 9.0)}, source="b")
    monkeypatch.setattr(select, "recorded_rows", lambda: tuple(recorded + again))
    assert select.best_prefetch("vllm_v1", 32, 8, 16, 16, 1024) == PrefetchConfig.from_label(LINE)


def test_an_unrecorded_kernel_gets_no_prefetch(recorded):
    assert select.best_prefetch("gqa", 32, 8, 16, 16, 1024) == PrefetchConfig()


def test_the_shipped_recording_gives_a_setting_of_its_own():
    """On the recorded H200 results: a valid choice, no prefetch for multi-head attention at a
    large batch (where every recording has it losing), and the same answer for every shape past
    the grid's edge as at the edge."""
    assert select.best_prefetch("gqa", 32, 32, 16, 128, 8192) == PrefetchConfig()
    edge = select.best_prefetch("gqa", 32, 8, 16, 128, 32768)
    assert select.best_prefetch("gqa", 32, 8, 16, 512, 2**20) == edge
