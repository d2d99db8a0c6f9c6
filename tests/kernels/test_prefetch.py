"""PrefetchConfig labels: every config's label parses back to it, and nothing else parses (CPU)."""

import itertools
import re

import pytest

from kvlab.kernels.prefetch import MAX_DISTANCE, MODES, PrefetchConfig

CONFIGS = [
    PrefetchConfig(mode, k, v, distance, evict_last)
    for mode, (k, v), distance, evict_last in itertools.product(
        MODES, itertools.product((False, True), repeat=2), range(1, MAX_DISTANCE + 1),
        (False, True))
]


def test_labels_round_trip():
    enabled = [config for config in CONFIGS if config.enabled]
    assert len(enabled) == 2 * 3 * MAX_DISTANCE * 2
    assert len({config.label() for config in enabled}) == len(enabled)
    for config in enabled:
        assert PrefetchConfig.from_label(config.label()) == config
    # every disabled config is "none", which stands for the default (the same instantiation)
    for config in CONFIGS:
        if not config.enabled:
            assert PrefetchConfig.from_label(config.label()) == PrefetchConfig()
            assert config.template_args() == PrefetchConfig().template_args()


@pytest.mark.parametrize(
    "label",
    ["fast", "", "none junk", "None", "bulk", "bulk K+V", "bulk K+V d=1 junk", "bulk KV d=1",
     "bulk K+V 1", "bulk K+V d=01", "bulk K+V d=+1", "bulk K+V d=1_0", "line K+V+K d=2",
     "line V+K d=2", "bulk K+V d=1 evict_last extra", "bulk K+V d=1 evict_last evict_last",
     "bulk K+V d=1  evict_last", " bulk K+V d=1", "bulk K+V d=1\n", "bulk + d=1", "none K+V d=1",
     "bulk K+V d=17", "bulk K+V d=0", "tma K+V d=1", "BULK K+V d=1", None, 3],
)
def test_bad_label(label):
    with pytest.raises(ValueError, match=re.escape(f"label={label!r}: not a PrefetchConfig label")):
        PrefetchConfig.from_label(label)
