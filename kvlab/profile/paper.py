"""The L2-prefetch paper's kernel counters (its Table 5.2), as plain data.

Source (SOURCE): a Chinese summary of "Accelerating LLM Inference Throughput via Asynchronous KV
Cache Prefetching" (arXiv 2504.06319, AAAI) among the design documents kvlab was started from
(seeds/000_f04b904209b8b24f.txt), section 五 5.2 "注意力内核性能", the table 内核性能对比:
for each of four models, the attention kernel's speedup and five counters without prefetch
("baseline": vLLM v0.7.1's XFormers backend) and with it. Section 5.1: NVIDIA H20 (96 GB HBM,
60 MB L2, 4.0 TB/s), FP16.

What the document does not state, and this module does not invent:
- the batch size and context of the table's measurements (section 5.4 varies them for
  end-to-end throughput only), so a reproduction picks its own points;
- the ncu metric of each row. The pairing with kvlab's counters (ROWS) is read from the row
  names: 计算吞吐 / 内存吞吐 ("compute / memory throughput") as ncu's Speed Of Light
  "Compute (SM) Throughput" and "Memory Throughput"; Stall周期 as Stall Long Scoreboard cycles
  per issued instruction, which section 1.2 supports: "CPI 27.68, 77% of it Stall Long
  Scoreboard", and 21.34 / 27.68 = 0.77.
The table gives all four models; the L1 hit rate (0.75%, sections 1.2 and 2.1) is given for the
Llama2-7B baseline only, and is not a row of the table, nor here.
"""

SOURCE = ("arXiv 2504.06319 (L2 prefetch of the KV cache), Table 5.2 (section 5.2, 内核性能对比) "
          "as summarised in kvlab's design documents (seeds/000_f04b904209b8b24f.txt); "
          "NVIDIA H20, FP16, baseline vLLM v0.7.1 XFormers")
GPU = "NVIDIA H20"
MODELS = ("llama2-7b", "llama3-8b", "qwen2.5-7b", "qwen2.5-14b")  # kvlab.config presets

# kvlab's column (kvlab.profile.ncu.METRICS) -> the table's row
ROWS = {
    "l2_hit_pct": "L2命中率 (L2 hit rate, %)",
    "long_scoreboard_cycles": "Stall周期 (Stall Long Scoreboard, cycles per instruction)",
    "cpi": "CPI (warp cycles per issued instruction)",
    "sm_throughput_pct": "计算吞吐 (compute throughput, % of peak)",
    "memory_throughput_pct": "内存吞吐 (memory throughput, % of peak)",
}
SPEEDUP_ROW = "内核加速 (kernel speedup)"

# column -> model -> (baseline, with prefetch), as Table 5.2 prints them
TABLE_5_2 = {
    "l2_hit_pct": {"llama2-7b": (0.06, 43.70), "llama3-8b": (38.35, 73.01),
                   "qwen2.5-7b": (55.90, 82.66), "qwen2.5-14b": (51.43, 77.11)},
    "long_scoreboard_cycles": {"llama2-7b": (21.34, 4.13), "llama3-8b": (16.66, 2.05),
                               "qwen2.5-7b": (16.38, 1.87), "qwen2.5-14b": (16.17, 1.96)},
    "cpi": {"llama2-7b": (27.68, 9.28), "llama3-8b": (21.42, 7.32),
            "qwen2.5-7b": (22.68, 7.36), "qwen2.5-14b": (20.94, 7.24)},
    "sm_throughput_pct": {"llama2-7b": (23.35, 48.22), "llama3-8b": (29.61, 61.15),
                          "qwen2.5-7b": (25.29, 60.95), "qwen2.5-14b": (30.52, 63.49)},
    "memory_throughput_pct": {"llama2-7b": (47.10, 86.88), "llama3-8b": (23.44, 66.96),
                              "qwen2.5-7b": (20.05, 63.50), "qwen2.5-14b": (24.16, 68.44)},
}
# model -> the attention kernel's speedup with prefetch, Table 5.2
SPEEDUP = {"llama2-7b": 1.84, "llama3-8b": 1.89, "qwen2.5-7b": 2.15, "qwen2.5-14b": 1.89}
