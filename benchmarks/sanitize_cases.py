"""Small launches of every kernel family and prefetch mode, and of a whole decoder's decode
steps (the layer ops of kernels/layer_ops.cu), the plain read of kernels/read_bytes.cu, and gqa
and the read built with the timeline stamps (kvlab.kernels.timeline), for compute-sanitizer:

    compute-sanitizer --tool memcheck python benchmarks/sanitize_cases.py
    compute-sanitizer --tool racecheck python benchmarks/sanitize_cases.py
"""

import torch

import kvlab
from kvlab.cache import PagedKVCache
from kvlab.kernels.read import PlainRead
from kvlab.kernels.timeline import Tracer
from kvlab.timing import Timer

PREFETCHES = [kvlab.PrefetchConfig(), kvlab.PrefetchConfig("bulk", evict_last=True),
              kvlab.PrefetchConfig("line")]


def main() -> None:
    torch.manual_seed(0)
    for kernel, layout, block_size, dtype, head_dim in (
            ("vllm_v1", "vllm", 16, torch.float16, 128), ("gqa", "hnd", 16, torch.float16, 128),
            ("gqa", "hnd", 128, torch.float16, 128), ("gqa", "hnd", 16, torch.float8_e4m3fn, 128),
            ("gqa", "hnd", 8, torch.float8_e4m3fn, 80)):  # fp8 80: the odd ldmatrix step
        # one CTA a sequence, then partitions / split-KV (gqa: mixed lengths as work lists),
        # then equal lengths (gqa: the natural grid, CTAs of 8 warps: kvlab.kernels.geometry)
        for lens in ([1, 17, 97], [700, 5], [200] * 3):
            cache = PagedKVCache(96, block_size, 2, head_dim, dtype=dtype, device="cuda",
                                 layout=layout, seed=1)
            seq_ids = [cache.add_sequence(*torch.randn(2, n, 2, head_dim, device="cuda").half())
                       for n in lens]
            q = torch.randn(len(lens), 6, head_dim, device="cuda", dtype=torch.float16)
            for prefetch in PREFETCHES:
                kvlab.decode_attention(q, cache, seq_ids, kernel=kernel, prefetch=prefetch)
            if dtype == torch.float8_e4m3fn:  # a bf16 q, converted to fp16 by the kernel
                kvlab.decode_attention(q.bfloat16(), cache, seq_ids, kernel=kernel,
                                       prefetch=PREFETCHES[0])
    # the cross-kernel prefetch of the weights and of the K/V blocks: on, then off
    for model, attention, ahead in (("tiny-qwen", "gqa", 0), ("tiny-llama", "vllm_v1", 0),
                                    ("tiny-llama", "gqa", 1 << 20),
                                    ("tiny-llama", "vllm_v1", 1 << 20)):
        llm = kvlab.LLM(model, attention=attention, device="cuda", num_blocks=16,
                        cuda_graphs=False, ahead_bytes=ahead, ahead_kv_bytes=ahead)
        for prompts in ([[3] * 20, [5] * 41], [[3] * 20, [5] * 41, [7] * 9]):  # linears, cuBLAS
            llm.generate(prompts, max_new_tokens=4)
    # gqa planned for capture (the natural grid, split as if both had 700 tokens), run on
    # shorter sequences: one split and one whole (its merge CTAs return at once), then none split
    # (only the merge's CTA (0, 0) waits for the decode grid)
    cache = PagedKVCache(96, 16, 2, 128, device="cuda", layout="hnd", seed=1)
    seq_ids = [cache.add_sequence(*torch.randn(2, n, 2, 128, device="cuda").half())
               for n in (700, 5)]
    plan = kvlab.DecodePlan.for_capture(cache, 2, 700, 8, kernel="gqa")
    q = torch.randn(2, 8, 128, device="cuda", dtype=torch.float16)
    for ids in (seq_ids, seq_ids[::-1], seq_ids[1:] * 2):
        tables = cache.block_tables(ids)
        plan.block_tables[:, :tables.shape[1]] = tables
        plan.seq_lens.copy_(cache.seq_lens(ids))
        plan.run(q)
    for num_words in (1, 513, 1_100_003):  # below a CTA, a few CTAs, past the unrolled loop
        PlainRead(16 * num_words).read()
    # the timeline build (kvlab.kernels.timeline), split, whole and mixed: its stamps stay in
    # bounds
    for lens in ([700] * 2, [200] * 3, [700, 5]):
        cache = PagedKVCache(96, 16, 2, 128, device="cuda", layout="hnd", seed=1)
        seq_ids = [cache.add_sequence(*torch.randn(2, n, 2, 128, device="cuda").half())
                   for n in lens]
        q = torch.randn(len(lens), 8, 128, device="cuda", dtype=torch.float16)
        tracer = Tracer(cache, seq_ids, 8, 2 * sum(lens) * 2 * 128 * 2)
        timer = Timer("cuda", flush_l2=False)
        tracer.trace_gqa(q, torch.empty_like(q), timer, spin=1000)
        tracer.trace_read(timer, spin=1000)
    torch.cuda.synchronize()
    print("sanitize cases ran")


if __name__ == "__main__":
    main()
