"""KVPR's Table 1 (ACL 2025), as plain data, and what kvlab's models predict beside it.

Source (SOURCE): a Chinese summary of "KVPR: Efficient LLM Inference With I/O-Aware KV Cache
Partial Recomputation" (ACL 2025 Findings) among the documents kvlab was started from
(seeds/001_4fbb84684116d58a.txt), Table 1: for OPT-6.7B, 13B and 30B at batch 32, sequence
length 1,024, FP16, on one A100 40GB whose host link is PCIe 4.0 x16 at 32 GB/s, the hidden size,
the KV cache (MB), the PCIe latency and the computation latency (ms).

What the numbers say the columns are (TABLE_1 keeps them as printed):
- "KV cache" is one layer's K and V in MiB: 2 b s h p = h / 8 MiB, 512 at h = 4,096. So the
  table is per layer, not per step.
- "PCIe latency" is that size over 32 GiB/s, to the printed digit (512 MiB / 32 GiB/s = 15.625
  ms; 19.53, 27.34). It is a division, not a measurement: PCIe 4.0 x16 carries at most 31.5 GB/s
  each way (16 GT/s x 16 lanes, 128b/130b), less than the 34.4 GB/s the column implies. kvlab's
  transfer time at the spec's 32 GB/s is 7.5% longer (`AGREEMENT`).
- "Comp. latency" grows with h, not h^2 (0.4388 / 0.3509 = 1.2505 against 5,120 / 4,096 = 1.25;
  0.6143 / 0.3509 = 1.7507 against 1.75), so it is not the recomputation of K, V for the 1,024
  tokens: N = 4 b s h^2 FLOPs, 2.2 TFLOP at h = 4,096, take 7.05 ms at the A100's 312 TFLOP/s,
  20x the column (25x and 35x for 13B and 30B). Its figures fit one read of the layer's K, V
  from HBM: 512 MiB at 1,555 GB/s is 0.345 ms, 0.984x the column (1.53 TB/s implied, 98% of the
  spec), as a decode step's attention over the cache reads them (its 4 b s h FLOPs take 1.7 us).
So Table 1 sets a transfer against a pass over the same bytes in HBM, not against the
recomputation KVPR trades for it: by the paper's own FLOP count at the A100's peak, recomputing
every token takes 0.42x the transfer (7.05 against 16.78 ms at OPT-6.7B), not the 0.02x the
table suggests, and the paper's model of time puts the best split at l = 721 of 1,024 there.

`table_1_rows` puts each column beside kvlab's prediction for a GPU of `kvlab.gpus` and its
ratio, with the best split l under the paper's and the pipelined model of time
(`kvlab.offload.scheduler`), which the paper does not give for this setting. Rates: "spec"
(the GPU's published host link, fp16 tensor and DRAM peaks: the paper's 32 GB/s, the A100's
312 TFLOP/s and 1,555 GB/s) or "h200-share" (each peak times the share of it the H200 reaches
in the recordings, `kvlab.gpus`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab import gpus
from kvlab.config import MODELS
from kvlab.offload.scheduler import LayerShape, LinkAndCompute, Split, best_split

SOURCE = ("KVPR (ACL 2025 Findings), Table 1, as summarised in kvlab's design documents "
          "(seeds/001_4fbb84684116d58a.txt): one A100 40GB, PCIe 4.0 x16 at 32 GB/s, batch 32, "
          "sequence length 1,024, FP16")
# The paper names no form factor; both A100 40GB entries have the same link, FP16 and HBM peaks.
PAPER_GPU = "a100-40gb-pcie"
BATCH, CONTEXT, DTYPE_BYTES = 32, 1024, 2
# model -> (hidden size, KV cache MB, PCIe latency ms, computation latency ms), as Table 1 prints
TABLE_1 = {
    "opt-6.7b": (4096, 512, 15.6, 0.3509),
    "opt-13b": (5120, 640, 19.5, 0.4388),
    "opt-30b": (7168, 896, 27.3, 0.6143),
}
RATES = ("spec", "h200-share")
MIB = 2**20
# quantity -> the largest |kvlab / paper - 1| the "spec" rates reach: the columns the models
# explain. The recomputation is not among them: 20-35x the column (see the module doc).
AGREEMENT = {"kv_mib": 0.0, "pcie_ms": 0.08, "hbm_read_ms": 0.02}
QUANTITIES = {
    "kv_mib": "KV cache of one layer (MiB)",
    "pcie_ms": "PCIe latency (ms): K, V over the host link",
    "recompute_ms": "Comp. latency (ms) as recomputing K, V of all 1,024 tokens",
    "hbm_read_ms": "Comp. latency (ms) as one HBM read of the layer's K, V",
    "split_paper": "best l, the paper's model of time",
    "split_pipelined": "best l, the pipelined model",
}


@dataclass(frozen=True)
class Rates:
    """What a prediction runs on: KVPR's v_com and v_gpu, the DRAM rate, and where each comes
    from (`sources`: host link, recompute, DRAM)."""

    h2d_gbps: float
    recompute_tflops: float
    dram_gbps: float
    sources: tuple[str, str, str]

    def link_and_compute(self) -> LinkAndCompute:
        return LinkAndCompute(self.h2d_gbps * 1e9, self.recompute_tflops * 1e12,
                              "; ".join(self.sources))


def rates_for(gpu_key: str = PAPER_GPU, rates: str = "spec") -> Rates:
    """The rates of GPU `gpu_key` (a key of kvlab.gpus.GPUS): its published peaks ("spec") or
    each peak times the H200's measured share of its own ("h200-share"). ValueError for an
    unknown key or rates."""
    g = gpus.gpu(gpu_key)
    if rates not in RATES:
        raise ValueError(f"rates={rates!r}: must be one of {RATES}")
    if rates == "spec":
        return Rates(g.host_gbps, g.fp16_tflops, g.hbm_gbps, (
            f"spec: {g.host_link} {g.host_gbps:g} GB/s", f"spec: {g.fp16_tflops:g} TFLOP/s FP16",
            f"spec: {g.hbm_gbps:g} GB/s DRAM"))
    parts = gpus.h2d_gbps(g), gpus.recompute_tflops(g), gpus.copy_roofline_gbps(g)
    return Rates(*(value for value, _ in parts), tuple(label for _, label in parts))


@dataclass(frozen=True)
class Prediction:
    """kvlab's figures for one model of Table 1: one layer, batch x context tokens."""

    model: str
    kv_bytes: int  # one layer's K and V: 2 b s kv p
    pcie_seconds: float  # kv_bytes / v_com
    recompute_seconds: float  # N(s) / v_gpu: K, V of every token recomputed
    hbm_read_seconds: float  # kv_bytes / DRAM rate: one read of them
    split_paper: Split
    split_pipelined: Split


def predict(model: str, gpu_key: str = PAPER_GPU, rates: str = "spec") -> Prediction:
    """kvlab's prediction of Table 1's row for `model` (a key of kvlab.config.MODELS) on GPU
    `gpu_key` with `rates` (see `rates_for`). ValueError for an unknown model, key or rates."""
    if model not in MODELS:
        raise ValueError(f"model={model!r}: must be one of kvlab.config.MODELS")
    r = rates_for(gpu_key, rates)
    shape, link = LayerShape(MODELS[model], BATCH, CONTEXT, DTYPE_BYTES), r.link_and_compute()
    kv_bytes = int(shape.kv_bytes(0))
    return Prediction(
        model, kv_bytes, kv_bytes / link.h2d_bytes_per_s,
        float(shape.recompute_flops(CONTEXT)) / link.recompute_flops_per_s,
        kv_bytes / (r.dram_gbps * 1e9), best_split(shape, link, "paper"),
        best_split(shape, link, "pipelined"))


@dataclass(frozen=True)
class Row:
    """One quantity of one model: Table 1's figure (None where the paper gives none), kvlab's,
    and for a split, its layer time and gain over full transfer (`detail`)."""

    model: str
    quantity: str  # a key of QUANTITIES
    paper: float | None
    predicted: float
    detail: str = ""

    @property
    def ratio(self) -> float | None:
        """kvlab / paper, None where the paper gives no figure."""
        return None if self.paper is None else self.predicted / self.paper


def table_1_rows(gpu_key: str = PAPER_GPU, rates: str = "spec") -> list[Row]:
    """Table 1 beside kvlab's predictions, QUANTITIES' rows per model in TABLE_1's order."""
    rows = []
    for model, (_, kv_mb, pcie_ms, comp_ms) in TABLE_1.items():
        p = predict(model, gpu_key, rates)
        rows += [Row(model, "kv_mib", kv_mb, p.kv_bytes / MIB),
                 Row(model, "pcie_ms", pcie_ms, 1e3 * p.pcie_seconds),
                 Row(model, "recompute_ms", comp_ms, 1e3 * p.recompute_seconds),
                 Row(model, "hbm_read_ms", comp_ms, 1e3 * p.hbm_read_seconds)]
        for name, split in (("split_paper", p.split_paper), ("split_pipelined", p.split_pipelined)):
            rows.append(Row(model, name, None, split.l, f"{1e3 * split.seconds:.2f} ms, "
                            f"{split.speedup:.2f}x full transfer"))
    return rows


def table_1_markdown(rows: list[Row]) -> list[str]:
    """`rows` as a Markdown table: model, quantity, paper, kvlab, kvlab / paper (four digits)."""
    lines = ["| model | quantity | paper | kvlab | kvlab / paper |", "|---|---|---|---|---|"]
    for row in rows:
        paper = "-" if row.paper is None else f"{row.paper:g}"
        if row.quantity.startswith("split"):
            predicted = f"{row.predicted:.0f} of {CONTEXT:,} ({row.detail})"
        else:  # four significant digits, trailing zeros kept; whole MiB as integers
            predicted = f"{row.predicted:g}" if row.quantity == "kv_mib" else (
                f"{row.predicted:#.4g}")
        ratio = "-" if row.ratio is None else f"{row.ratio:.4f}"
        lines.append(f"| {MODELS[row.model].name} | {QUANTITIES[row.quantity]} | {paper} | "
                     f"{predicted} | {ratio} |")
    return lines
