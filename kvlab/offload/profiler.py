"""KVPR's profiler: the host link rate `v_com` and the recompute rate `v_gpu`, measured here, and a
drift monitor that says when to measure them again during a run (the paper profiles once, before
inference, and names that as a limitation).
"""

from __future__ import annotations

import torch

from kvlab.bench.timing import Timer
from kvlab.checks import check_positive_int
from kvlab.config import ModelConfig
from kvlab.offload.host import PinnedHostMemory
from kvlab.offload.recompute import AttentionWeights, project_kv
from kvlab.offload.scheduler import LinkAndCompute

DIRECTIONS = ("h2d", "d2h")


def link_bytes_per_s(device, direction: str = "h2d", num_bytes: int = 256 * 2**20,
                     num_runs: int = 10) -> float:
    """Pinned host <-> device copy rate in bytes/s (CUDA events, median of `num_runs`)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r}: must be one of {DIRECTIONS}")
    pinned = PinnedHostMemory(num_bytes)  # NOTE: unpinned when collected: keep it until done
    gpu = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    src, dst = (pinned.bytes, gpu) if direction == "h2d" else (gpu, pinned.bytes)
    ms = Timer(device, num_runs=num_runs, flush_l2=False).median_ms(
        lambda: dst.copy_(src, non_blocking=True)
    )
    del pinned
    return num_bytes / (ms * 1e-3)


def recompute_flops_per_s(model: ModelConfig, tokens: int, device, dtype=torch.float16,
                          num_runs: int = 10) -> float:
    """FLOP/s of K, V recomputation (GEMMs, bias, RoPE) for `tokens` rows of `model`, counting
    the GEMMs' 4 x tokens x hidden x kv FLOPs."""
    check_positive_int("tokens", tokens)
    w = AttentionWeights.random(model, seed=0, dtype=dtype, device=device)
    x = torch.randn(tokens, model.hidden_size, dtype=dtype, device=device)
    positions = torch.arange(tokens, device=device)
    ms = Timer(device, num_runs=num_runs).median_ms(lambda: project_kv(model, w, x, positions))
    return 4.0 * tokens * model.hidden_size * model.kv_size / (ms * 1e-3)


def profile(model: ModelConfig, tokens: int, device="cuda") -> LinkAndCompute:
    """`v_com` (pinned H2D) and `v_gpu` (recompute of `tokens` rows) measured on `device`."""
    return LinkAndCompute(
        h2d_bytes_per_s=link_bytes_per_s(device),
        recompute_flops_per_s=recompute_flops_per_s(model, tokens, device),
        source=f"measured on {torch.cuda.get_device_name(device)}",
    )


class DriftMonitor:
    """Flags when measured step times leave the predicted ones: `observe` returns True once
    `patience` steps in a row are off by more than `tolerance` (relative), then starts over."""

    def __init__(self, tolerance: float = 0.10, patience: int = 3):
        if not 0 < tolerance < 1:
            raise ValueError(f"tolerance={tolerance!r}: must be in (0, 1)")
        check_positive_int("patience", patience)
        self.tolerance, self.patience, self._run = tolerance, patience, 0

    def observe(self, measured_s: float, predicted_s: float) -> bool:
        if predicted_s <= 0:
            raise ValueError(f"predicted_s={predicted_s!r}: must be positive")
        off = abs(measured_s / predicted_s - 1) > self.tolerance
        self._run = self._run + 1 if off else 0
        if self._run >= self.patience:
            self._run = 0
            return True
        return False
