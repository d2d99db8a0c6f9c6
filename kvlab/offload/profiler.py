"""KVPR's profiler: the host link rate `v_com` and the recompute rate `v_gpu`, measured here, and a
drift monitor that says when to measure them again during a run (the paper profiles once, before
inference, and names that as a limitation).
"""

from __future__ import annotations

import statistics

import torch

from kvlab.bench.timing import Timer, back_to_back_ms
from kvlab.checks import check_positive_int
from kvlab.config import ModelConfig
from kvlab.offload.host import PinnedHostMemory
from kvlab.offload.model import LayerWeights, decode_layer
from kvlab.offload.recompute import AttentionWeights, RopeTable, project_kv
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


def layer_seconds(model: ModelConfig, batch: int, context: int, device, dtype=torch.float16,
                  num_runs: int = 10) -> float:
    """Seconds per layer of decode work (attention over `context` cached tokens, the projections,
    the MLP) for `batch` sequences with its K, V resident, timed back to back: the slower of the
    GPU and the host's enqueueing, as in the runtime (Llama's layer is some 30 small operations:
    at small batches the host sets the pace)."""
    check_positive_int("batch", batch)
    check_positive_int("context", context)
    w = LayerWeights.random(model, seed=0, dtype=dtype, device=device)
    kv = (context + 1, batch, model.num_kv_heads, model.head_dim)
    k, v = (torch.randn(kv, dtype=dtype, device=device) for _ in range(2))
    hidden = torch.randn(batch, model.hidden_size, dtype=dtype, device=device)
    rope = RopeTable.build(model, context + 1, dtype, device) if model.position == "rope" else None
    ms = back_to_back_ms(lambda: decode_layer(model, w, hidden, context, k, v, rope), device,
                         num_calls=num_runs)
    return ms * 1e-3


def profile(model: ModelConfig, batch: int, context: int, device="cuda") -> LinkAndCompute:
    """The rates of a step of `batch` sequences of `context` cached tokens, measured on `device`:
    `v_com` (pinned H2D, and D2H), `v_gpu` (recomputing all batch x context rows) and the GPU
    time of one layer's own work."""
    return LinkAndCompute(
        h2d_bytes_per_s=link_bytes_per_s(device),
        recompute_flops_per_s=recompute_flops_per_s(model, batch * context, device),
        source=f"measured on {torch.cuda.get_device_name(device)}",
        d2h_bytes_per_s=link_bytes_per_s(device, "d2h"),
        layer_seconds=layer_seconds(model, batch, context, device),
    )


class DriftMonitor:
    """Says when to profile again: the ratio of measured to predicted step time is taken as
    normal over the first `patience` steps (the models leave the attention and the MLP out, so
    it is above 1), and `observe` returns True once `patience` steps in a row leave that ratio by
    more than `tolerance` (relative). Then it learns the ratio afresh, as after a new profile."""

    def __init__(self, tolerance: float = 0.10, patience: int = 3):
        if not 0 < tolerance < 1:
            raise ValueError(f"tolerance={tolerance!r}: must be in (0, 1)")
        check_positive_int("patience", patience)
        self.tolerance, self.patience = tolerance, patience
        self.reference: float | None = None  # the normal measured / predicted ratio
        self._ratios: list[float] = []

    def observe(self, measured_s: float, predicted_s: float) -> bool:
        if predicted_s <= 0:
            raise ValueError(f"predicted_s={predicted_s!r}: must be positive")
        ratio = measured_s / predicted_s
        if self.reference is None:
            self._ratios.append(ratio)
            if len(self._ratios) == self.patience:
                self.reference = statistics.median(self._ratios)
                self._ratios = []
            return False
        off = abs(ratio / self.reference - 1) > self.tolerance
        self._ratios = self._ratios + [ratio] if off else []
        if len(self._ratios) >= self.patience:
            self.reference, self._ratios = None, []
            return True
        return False
