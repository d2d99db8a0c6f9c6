"""The decode kernels' geometry and split policies, in Python and numpy (no torch, no CuPy):
what the launchers (`vllm_v1`, `gqa`) plan with, and what the L2 model (`kvlab.sim`) and the
profiler's specs need on machines without a GPU. The CUDA sources state the same numbers in
their headers.
"""

import numpy as np

# vllm_v1 (kernels/paged_decode_vllm.cu)
VLLM_BLOCK_SIZES = (8, 16, 32)
VLLM_NUM_WARPS = 4  # 128 threads per CTA
PARTITION_SIZE = 512  # tokens per CTA of v2
MAX_V1_SEQ_LEN = 8192  # like vLLM: v1 only up to this many tokens

# gqa (kernels/paged_decode_gqa.cu)
GQA_BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
GQA_MAX_GROUP = 8  # query heads per KV head: the n-width of one mma
GQA_NUM_WARPS = 4
GQA_WARP_TOKENS = 16  # rows of a tile owned by one warp
GQA_TILE_TOKENS = GQA_NUM_WARPS * GQA_WARP_TOKENS  # 64 tokens per main-loop iteration
PARTITION_QUANTUM = 256  # gqa partition sizes are multiples of this many tokens
PARTITION_OVERHEAD_TOKENS = 128  # a CTA's fixed cost (prologue, pipeline fill, merge), in tokens
SM_SHARED_BYTES = 228 * 1024  # shared memory per SM on Hopper (H100, H200)
CTA_RESERVED_SHARED_BYTES = 1024  # what the driver reserves per resident CTA


def use_partitions(num_seqs: int, num_qo_heads: int, max_seq_len: int, num_sms: int) -> bool:
    """Whether vllm_v1 runs v2 (PARTITION_SIZE-token CTAs and a reduce): past MAX_V1_SEQ_LEN, or
    when one CTA per (query head, sequence) leaves the GPU short of work."""
    num_partitions = -(-max_seq_len // PARTITION_SIZE)
    if max_seq_len > MAX_V1_SEQ_LEN:
        return True
    return num_partitions > 1 and num_seqs * num_qo_heads < 4 * num_sms


def vllm_smem_bytes(head_dim: int, block_size: int, partition_size: int,
                    max_seq_len: int) -> int:
    """Dynamic shared memory of vllm_decode: fp32 logits for the tokens one CTA covers, or the
    cross-warp output reduction, whichever is larger."""
    num_tokens = partition_size or -(-max_seq_len // block_size) * block_size
    return max(num_tokens * 4, (VLLM_NUM_WARPS // 2) * head_dim * 4)


def gqa_stages(kv_bytes: int = 2) -> int:
    """cp.async stages of gqa_decode: 3 for fp16/bf16 caches; 5 for fp8 (whose tiles carry half
    the bytes: 4 in flight, as many bytes as fp16's 2)."""
    return 5 if kv_bytes == 1 else 3


def gqa_smem_bytes(head_dim: int, kv_bytes: int = 2) -> int:
    """Dynamic shared memory of gqa_decode with cache elements of `kv_bytes` (2: fp16/bf16, 1:
    fp8): stages x 4 warps x (16 K + 16 V rows), each row padded (16 or 32 bytes) to an odd
    multiple of 16 bytes against bank conflicts."""
    row = head_dim * kv_bytes
    row += 16 if (row // 16) % 2 == 0 else 32
    return gqa_stages(kv_bytes) * GQA_NUM_WARPS * 2 * GQA_WARP_TOKENS * row


def ctas_per_sm(head_dim: int, kv_bytes: int = 2) -> int:
    """How many gqa_decode CTAs fit on one SM: shared memory is the limit."""
    return SM_SHARED_BYTES // (gqa_smem_bytes(head_dim, kv_bytes) + CTA_RESERVED_SHARED_BYTES)


def partition_size(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_slots: int,
                   seq_lens=None) -> int:
    """gqa's tokens per partition (a multiple of PARTITION_QUANTUM) when `num_slots` CTAs run at
    once.

    Minimises the makespan model `waves x (partition tokens + PARTITION_OVERHEAD_TOKENS)`, where
    waves = ceil(CTAs / num_slots); ties go to fewer partitions (less merge work).
    seq_lens: the batch's lengths (None: num_seqs sequences of max_seq_len). The CTAs are the
    partitions that hold tokens (one at least per sequence and KV head), each counted as a whole
    partition: in a batch of mixed lengths the long sequences are split by what the whole batch
    fills, instead of running alone at the end while the rest of the GPU idles.
    NOTE: observed on the H200 when this was written (not a recorded result): llama3-8b at batch
    16 x 32k ran 93.5% of the roofline with 2 partitions (256 CTAs in 264 slots: one wave), 92.1%
    with 9 and 87.3% with 3 (two waves).
    """
    lens = None if seq_lens is None else np.asarray(seq_lens, dtype=np.int64)

    def makespan(size: int) -> tuple[int, int]:
        if lens is None:
            partitions = num_seqs * -(-max_seq_len // size)
        else:
            partitions = int(np.maximum(1, -(-lens // size)).sum())
        waves = -(-partitions * num_kv_heads // num_slots)
        return waves * (size + PARTITION_OVERHEAD_TOKENS), -size

    q = PARTITION_QUANTUM
    sizes = {-(-max_seq_len // n // q) * q for n in range(1, -(-max_seq_len // q) + 1)}
    return min(sizes, key=makespan)


def work_list(seq_lens, size: int) -> np.ndarray:
    """gqa's CTAs for a split of `size` tokens per partition: int32 [num_items, 2] (sequence,
    partition), the partitions that hold tokens (partition 0 of every sequence, even an empty
    one), the longest first (ties in sequence order), so that short last partitions fill the
    tail of the launch."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    counts = np.maximum(1, -(-lens // size))
    seq = np.repeat(np.arange(lens.size), counts)
    partition = np.arange(seq.size) - np.repeat(np.cumsum(counts) - counts, counts)
    tokens = np.minimum(size, lens[seq] - partition * size)
    order = np.lexsort((partition, seq, -tokens))
    return np.stack([seq[order], partition[order]], axis=1).astype(np.int32)
