"""The README's findings, one sentence each, from the recordings its links lead to."""

from __future__ import annotations

import statistics

from kvlab.results import load_result, speedups

from . import decode, e2e, flashinfer, fp8, kvpr
from .common import context_label, value_range

E2E_MODEL = "llama3-8b"  # the model whose tokens/s the README names


def prefetch_in_the_kernel() -> str:
    """The paper's prefetch against none in the same loop over the attention grid, per family."""
    rows = [r for r in load_result("h200", "attention")["rows"] if r["block_size"] == 16]
    best = {}
    for row, speedup in speedups(rows):
        if row["prefetch"] != "none" and row["kernel"] in ("vllm_v1", "gqa"):
            key = (row["kernel"], row["model"], row["batch"], row["context"])
            best.setdefault(key, []).append((speedup, row))
    gain = {k: max(v, key=lambda s: s[0]) for k, v in best.items()}
    worst = min(s for k, v in best.items() if k[0] == "vllm_v1" for s, _ in v)

    def top(kernel):
        speedup, row = max((g for k, g in gain.items() if k[0] == kernel), key=lambda g: g[0])
        return f"{speedup:.2f}x (batch {row['batch']} x {context_label(row['context'])})"

    return (f"`vllm_v1`'s best setting gains at most {top('vllm_v1')} and its worst runs "
            f"{worst:.2f}x as fast as none; `gqa`, which reads each KV byte once, gains at most "
            f"{top('gqa')}")


def prefetch_on_fewer_sms() -> str:
    """The regime map's medians for vllm_v1: the best setting over none per SM count."""
    from kvlab.viz.regime import regime_cells

    cells = regime_cells(load_result("h200", "attention_sms")["rows"], "vllm_v1")
    by_sms = {}
    for cell in cells:
        by_sms.setdefault(cell["sms"], []).append(cell["speedup"])
    return ", ".join(f"{statistics.median(v):.2f}x on {sms} SMs"
                     for sms, v in sorted(by_sms.items(), reverse=True))


def end_to_end() -> str:
    """The fastest kvlab variant's tokens/s and its speed over HF's static cache at the target
    batch; its step over the roofline step at batch 1 and from batch 16."""
    best = {key: (e2e.fastest(v), v["hf-static"]) for key, v in e2e.steps().items()}
    mine, hf = best[E2E_MODEL, e2e.TARGET_BATCH]
    others = ", ".join(f"{m} {h['step_ms'] / b['step_ms']:.2f}x" for (m, batch), (b, h)
                       in best.items() if batch == e2e.TARGET_BATCH and m != E2E_MODEL)

    def roofline(keep):
        return value_range([b["step_ms"] / b["roofline_ms"] for (_, batch), (b, _) in best.items()
                       if keep(batch)])

    return (f"{E2E_MODEL} decodes {mine['tokens_per_s']:,.0f} tokens/s at batch "
            f"{e2e.TARGET_BATCH}, {hf['step_ms'] / mine['step_ms']:.2f}x HF transformers' "
            f"static cache on the same weights ({others}); a step takes "
            f"{roofline(lambda b: b == 1)} the roofline step at batch 1 and "
            f"{roofline(lambda b: b > 1)} from batch 16")


def kvpr_gain() -> str:
    """At every multi-head point from kvpr.MHA_TOKENS (row schedule, resident weights): the
    fastest KVPR setting over full transfer, HF's offloaded cache over full transfer, and KVPR
    over HF."""
    grid = {k: p for k, p in kvpr.points().items()
            if kvpr.multi_head(k[0]) and k[2] >= kvpr.MHA_TOKENS}
    over_full = [p["full-transfer"]["step_ms"] / kvpr.fastest(p)["step_ms"]
                 for p in grid.values()]
    with_hf = [p for p in grid.values() if "hf-offloaded" in p]
    hf_full = [p["hf-offloaded"]["step_ms"] / p["full-transfer"]["step_ms"] for p in with_hf]
    hf_kvpr = [p["hf-offloaded"]["step_ms"] / kvpr.fastest(p)["step_ms"] for p in with_hf]
    return (f"decode steps run {value_range(over_full)} faster than full transfer at every "
            f"multi-head point of {kvpr.MHA_TOKENS // 1024}k tokens or more; HF transformers' "
            f"offloaded cache, timed in turn at steady state, takes {value_range(hf_full)} full "
            f"transfer there, so KVPR beats it by {value_range(hf_kvpr)}")


def prefetch_on_other_gpus() -> str:
    """kvlab.predict's bulk-prefetch speedup for llama3-8b vllm_v1 on the GPUs of kvlab.gpus."""
    from kvlab.predict import prefetch_speedup

    def speedup(gpu, batch, context):
        return prefetch_speedup("llama3-8b", batch, context, "bulk K+V d=1", gpu=gpu)

    hopper = ("h200", "h100-sxm", "h20", "h800-sxm", "gh200")
    grid = [(1, 4096), (1, 32768), (16, 4096), (64, 8192)]
    small = [speedup(g, 1, 4096) for g in hopper]
    big = [speedup(g, 64, 8192) for g in ("h100-sxm", "h800-sxm", "h200", "gh200")]
    return (f"at 1 x 4k every Hopper GPU gains {value_range(small)}, "
            f"at 64 x 8k the H100, H800, H200 and GH200 lose ({value_range(big)}), and the H20 and "
            f"the B200 gain at most {max(speedup('h20', *p) for p in grid):.2f}x and "
            f"{max(speedup('b200', *p) for p in grid):.2f}x")


BLOCKS = {
    "readme.prefetch-in-the-kernel": prefetch_in_the_kernel,
    "readme.prefetch-on-fewer-sms": prefetch_on_fewer_sms,
    "readme.gqa-large": lambda: decode.large(load_result("h200", "attention")),
    "readme.gqa-vs-sdpa": lambda: decode.vs_sdpa(load_result("h200", "attention")),
    "readme.fp8-large": lambda: fp8.large(load_result("h200", "attention_fp8")),
    "readme.end-to-end": end_to_end,
    "readme.flashinfer": lambda: flashinfer.headline(load_result(*flashinfer.GRID),
                                                     load_result(*flashinfer.E2E)),
    "readme.flashinfer-h200": flashinfer.h200_headline,
    "readme.kvpr": kvpr_gain,
    "readme.prefetch-on-other-gpus": prefetch_on_other_gpus,
}
