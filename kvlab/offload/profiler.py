"""KVPR's profiler: the host link rate `v_com` and the recompute rate `v_gpu`, measured here, and a
drift monitor that says when to measure them again during a run (the paper profiles once, before
inference, and names that as a limitation).
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from kvlab.checks import check_positive_int, check_real, is_real
from kvlab.config import ModelConfig
from kvlab.model.rope import RopeTable
from kvlab.model.weights import AttentionWeights, LayerWeights
from kvlab.offload.graphs import StaticLayers
from kvlab.offload.host import PinnedHostMemory
from kvlab.offload.recompute import recompute_kv
from kvlab.offload.runtime import KVPRDecoder
from kvlab.offload.scheduler import LinkAndCompute, token_chunks
from kvlab.timing import Timer, back_to_back_ms

DIRECTIONS = ("h2d", "d2h")


def link_bytes_per_s(device, direction: str = "h2d", num_bytes: int = 256 * 2**20,
                     num_runs: int = 10) -> float:
    """Pinned host <-> device copy rate in bytes/s (CUDA events, median of `num_runs`)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r}: must be one of {DIRECTIONS}")
    check_positive_int("num_bytes", num_bytes)
    check_positive_int("num_runs", num_runs)
    pinned = PinnedHostMemory(num_bytes)  # NOTE: unpinned when collected: keep it until done
    gpu = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    src, dst = (pinned.bytes, gpu) if direction == "h2d" else (gpu, pinned.bytes)
    ms = Timer(device, num_runs=num_runs, flush_l2=False).median_ms(
        lambda: dst.copy_(src, non_blocking=True)
    )
    del pinned
    return num_bytes / (ms * 1e-3)


def recompute_flops_per_s(model: ModelConfig, batch: int, context: int, device,
                          dtype=torch.float16, num_chunks: int = 1, num_runs: int = 10) -> float:
    """FLOP/s of K, V recomputation as the runtime runs it: every one of `context` tokens of
    `batch` sequences, in `num_chunks` chunks (`recompute_kv`: GEMMs, bias, RoPE), enqueued back
    to back, so that the host's cost per chunk counts where it exceeds the GPU's. Counts the
    GEMMs' 4 x tokens x hidden x kv FLOPs."""
    for name, value in (("batch", batch), ("context", context), ("num_chunks", num_chunks),
                        ("num_runs", num_runs)):
        check_positive_int(name, value)
    w = AttentionWeights.random(model, seed=0, dtype=dtype, device=device)
    x = torch.randn(context, batch, model.hidden_size, dtype=dtype, device=device)
    k, v = (torch.empty(context, batch, model.num_kv_heads, model.head_dim, dtype=dtype,
                        device=device) for _ in range(2))
    rope = RopeTable.build(model, context, dtype, device) if model.position == "rope" else None
    chunks = token_chunks(context, num_chunks)

    def recompute():
        for a, b in chunks:
            recompute_kv(model, w, x[a:b], k[a:b], v[a:b], a, rope)

    ms = back_to_back_ms(recompute, device, num_calls=num_runs)
    return 4.0 * batch * context * model.hidden_size * model.kv_size / (ms * 1e-3)


def layer_seconds(model: ModelConfig, batch: int, context: int, device, dtype=torch.float16,
                  cuda_graphs: bool = True, num_runs: int = 10) -> float:
    """Seconds per layer of decode work (attention over `context` cached tokens, the projections,
    the MLP) for `batch` sequences with its K, V resident, run as the runtime runs it
    (`StaticLayers`, CUDA graphs unless `cuda_graphs` is False) and timed back to back: the
    slower of the GPU and the host's enqueueing."""
    check_positive_int("batch", batch)
    check_positive_int("context", context)
    check_positive_int("num_runs", num_runs)
    w = LayerWeights.random(model, seed=0, dtype=dtype, device=device)
    kv = (context + 1, batch, model.num_kv_heads, model.head_dim)
    k, v = (torch.randn(kv, dtype=dtype, device=device) for _ in range(2))
    hidden = torch.randn(1, batch, model.hidden_size, dtype=dtype, device=device)
    rope = RopeTable.build(model, context + 1, dtype, device) if model.position == "rope" else None
    layer = StaticLayers(model, [w], hidden, [k], [v], rope, capture=cuda_graphs)
    layer.set_position(context)
    ms = back_to_back_ms(lambda: layer.run(0, 0, 0), device, num_calls=num_runs)
    return ms * 1e-3


def host_seconds(decoder: KVPRDecoder, num_runs: int = 3) -> tuple[float, float]:
    """(the host's time to enqueue one unit of `decoder`'s step at l = 0, what each recompute
    chunk adds to it), in seconds: the wall clock of steps at l = 0 and at l = num_chunks (one
    token per chunk, so the GPU's work stays that of l = 0 and the host never waits for it), from
    the stores' current length, which is restored after; the token at that length is written
    and is written again by the next step. The host's cost of a CUDA call grows with the work
    queued on the GPU (on the H200's machine a unit over a store of a few tokens cost the host
    about half what it cost at Llama-2-7B 8 x 512), so it is measured on the decoder itself."""
    check_positive_int("num_runs", num_runs)
    stores, chunks = decoder.stores, decoder.num_chunks
    length = stores[0].length
    if length < chunks:
        raise ValueError(f"stores hold {length} tokens: host_seconds needs at least num_chunks="
                         f"{chunks}")
    hidden = torch.zeros(decoder.batch, decoder.model.hidden_size, dtype=stores[0].dtype,
                         device=decoder.device)

    def unit_seconds(l: int) -> float:
        times = []
        for _ in range(num_runs + 1):  # the first warms up
            torch.cuda.synchronize(decoder.device)
            start = time.perf_counter()
            decoder.step(hidden, l)
            times.append(time.perf_counter() - start)
            for store in stores:
                store.length = length
        torch.cuda.synchronize(decoder.device)
        return statistics.median(times[1:]) / len(decoder.units())

    bare = unit_seconds(0)
    return bare, max(unit_seconds(chunks) - bare, 0.0) / chunks


def profile(model: ModelConfig, batch: int, context: int, device="cuda",
            decoder: KVPRDecoder | None = None) -> LinkAndCompute:
    """The rates of a step of `batch` sequences of `context` cached tokens, measured on `device`:
    `v_com` (pinned H2D, and D2H), `v_gpu` (recomputing all batch x context rows) and the time
    of one layer's own work; given the `decoder` that will run the steps, these follow its
    chunks and CUDA graphs, and the host's time per unit and per chunk is measured on it
    (`host_seconds`). ValueError for a batch or context that is not a positive integer, before
    anything is measured."""
    check_positive_int("batch", batch)
    check_positive_int("context", context)
    chunks, graphs = (1, True) if decoder is None else (decoder.num_chunks, decoder.cuda_graphs)
    host = (0.0, 0.0) if decoder is None else host_seconds(decoder)
    return LinkAndCompute(
        h2d_bytes_per_s=link_bytes_per_s(device),
        recompute_flops_per_s=recompute_flops_per_s(model, batch, context, device,
                                                    num_chunks=chunks),
        source=f"measured on {torch.cuda.get_device_name(device)}",
        d2h_bytes_per_s=link_bytes_per_s(device, "d2h"),
        layer_seconds=layer_seconds(model, batch, context, device, cuda_graphs=graphs),
        unit_host_seconds=host[0],
        chunk_host_seconds=host[1],
    )


class DriftMonitor:
    """Says when to profile again: the ratio of measured to predicted step time is taken as
    normal over the first `patience` steps (the models leave the attention and the MLP out, so
    it is above 1), and `observe` returns True once `patience` steps in a row leave that ratio by
    more than `tolerance` (relative). Then it learns the ratio afresh, as after a new profile."""

    def __init__(self, tolerance: float = 0.10, patience: int = 3):
        if not (is_real(tolerance) and 0 < tolerance < 1):
            raise ValueError(f"tolerance={tolerance!r}: must be a number in (0, 1)")
        check_positive_int("patience", patience)
        self.tolerance, self.patience = float(tolerance), int(patience)
        self.reference: float | None = None  # the normal measured / predicted ratio
        self._ratios: list[float] = []

    def observe(self, measured_s: float, predicted_s: float) -> bool:
        """Whether to profile again after a step of `measured_s` seconds predicted to take
        `predicted_s`. ValueError, leaving the monitor as it was, unless both are finite and
        positive with a finite ratio."""
        check_real("measured_s", measured_s, 0, open_min=True)
        check_real("predicted_s", predicted_s, 0, open_min=True)
        ratio = float(measured_s) / float(predicted_s)
        if not 0 < ratio < math.inf:
            raise ValueError(f"measured_s / predicted_s = {measured_s!r} / {predicted_s!r}: "
                             "the ratio must be a finite positive number")
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
